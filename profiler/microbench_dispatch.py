"""The per-operator dispatch figure of a host CPU, measured over a calibration's whole span.

`microbench.dispatch_s` times a chain of tiny operators for ~5 ms in each round. On the 2-vCPU
VM this project is built on, that figure is not one number but two: two processes timing the
chain every ~0.2 s for a minute (2026-11-29, nothing else running) read 3.9 us per operator at
the 10th percentile, 6.6 at the median and 8.0 at the 90th, switching between a fast (~4 us)
and a slow (~7 us) state in spells of a fraction of a second to several seconds; the median of
three consecutive readings (what three rounds keep) ranged 3.9-8.6 us within that minute. The
calibrations of the closed-loop records of 2026-11-28/29 read 4.3-9.3 us per operator, and a
small model's step on a CPU is mostly dispatch (GPT-2 tiny: thousands of operators per step),
so their predictions of the same plan moved more from record to record (0.11-0.13 standard
deviation of the log) than the runs' measured steps did (0.07-0.10).

`DispatchSampler` times the same chains again at every progress point of the calibration (a
couple of hundred, over its minutes, on every rank at about the same moment), and the figure
becomes the median of all of them, pooled over the ranks: the operator cost of the machine over
minutes, as a training run of tens of seconds meets it, not of the 15 ms a round happened to
catch. The median, as a run's step time is the median of its steps. Only on a CPU: a GPU's
kernels run on their own clocks and its host's dispatch hides behind the launch queue; there
the rounds' figure stays.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..planner.cost.calibrated import KernelFit
from . import microbench as mb
from .microbench_timer import Timer

SAMPLE_CALLS = 3
"""Timed calls of each chain per sample (the timer's warm-up call first): ~0.25 ms without
autograd, ~0.8 ms with it here; a sample keeps their median."""
MIN_SAMPLES = 10
"""Fewer pooled samples than this (a `--quick` calibration on one rank) keep the rounds'
figure."""


@dataclass(frozen=True)
class DispatchFigure:
    """Seconds per operator of one dtype, as `microbench.dispatch_s` returns them."""

    raw_s: float
    """Outside autograd."""
    trained_s: float
    """Half of one operator's forward plus backward."""


class DispatchSampler:
    """Times the dispatch chains of each dtype at every progress point (nothing off a CPU)."""

    def __init__(self, device: torch.device, dtypes: Sequence[str]) -> None:
        self.active = device.type == "cpu"
        self._timer = Timer(device, SAMPLE_CALLS, group=False)
        self.samples: dict[str, list[DispatchFigure]] = (
            {key: [] for key in dtypes} if self.active else {}
        )

    def sample(self) -> None:
        """Time each dtype's chains once more (`microbench.dispatch_s`, `SAMPLE_CALLS` calls)."""
        for key, samples in self.samples.items():
            raw, trained = mb.dispatch_s(self._timer, mb.DTYPES[key], SAMPLE_CALLS)
            samples.append(DispatchFigure(raw_s=raw, trained_s=trained))


def pooled_figures(
    per_rank: Sequence[dict[str, list[DispatchFigure]]],
) -> dict[str, DispatchFigure]:
    """Per dtype, the median of every rank's samples (each field on its own); a dtype with
    fewer than `MIN_SAMPLES` samples in all is left out (its rounds' figure stands)."""
    out: dict[str, DispatchFigure] = {}
    for key in sorted({k for samples in per_rank for k in samples}):
        pool = [s for samples in per_rank for s in samples.get(key, [])]
        if len(pool) >= MIN_SAMPLES:
            out[key] = DispatchFigure(
                raw_s=statistics.median(s.raw_s for s in pool),
                trained_s=statistics.median(s.trained_s for s in pool),
            )
    return out


def with_span_dispatch(
    fits: Sequence[tuple[str, KernelFit]], spans: dict[str, DispatchFigure]
) -> list[tuple[str, KernelFit]]:
    """`fits` (dtype key, rounds' fit) with each dtype's dispatch figures from `spans` where it
    has them (`pooled_figures`)."""
    return [
        (key, fit)
        if key not in spans
        else (
            key,
            dataclasses.replace(
                fit, raw_dispatch_s=spans[key].raw_s, launch_s=spans[key].trained_s
            ),
        )
        for key, fit in fits
    ]
