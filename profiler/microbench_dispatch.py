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

The multi-rank parts that measure host work (DTensor's per TP block and loss, FSDP2's per unit
and tensor, AdamW's per DTensor parameter) each take a few seconds, one spell of the VM's:
across the calibrations of 2026-11-29 the same TP+SP block read 3.5-8.4 ms forward while the
pooled operator figure read 4.0-4.3 us (6.3 once), and the closed loop's TP+SP and FSDP plans
missed by what their part's spell added (record G, docs/benchmarks.md). So each of those parts
samples the dispatch chains between its rounds too (`DispatchSampler.during`), and its figures
are scaled by the pooled figure over the median of its own samples (`speed_ratio`): host work
priced at the one machine speed every operator-by-operator price assumes.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from ..planner.calibration_tp import TensorParallelDispatch
from ..planner.cost.calibrated import KernelFit
from . import microbench as mb
from .microbench_timer import Timer

T = TypeVar("T")

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

    def during(self, measure: Callable[[Callable[[], None]], T]) -> tuple[T, Window]:
        """`measure(between)`'s result, and the window of the samples it took by calling
        `between` (this sampler's `sample`) between its rounds (collective where `measure` is:
        every rank calls it alike)."""
        start = self._count()
        value = measure(self.sample)
        return value, Window(start=start, stop=self._count())

    def speed_ratio(self, window: Window, pooled: dict[str, DispatchFigure]) -> float:
        """The pooled per-operator figure over this rank's median in `window` (with autograd):
        how much faster the calibration's span ran than the part that took those samples (1
        where the window holds fewer than `MIN_WINDOW_SAMPLES` or nothing was pooled)."""
        for key, samples in self.samples.items():
            part = samples[window.start : window.stop]
            if key in pooled and len(part) >= MIN_WINDOW_SAMPLES:
                return pooled[key].trained_s / statistics.median(s.trained_s for s in part)
        return 1.0

    def _count(self) -> int:
        return min((len(s) for s in self.samples.values()), default=0)


MIN_WINDOW_SAMPLES = 3
"""Fewest samples within a part's window that set its speed ratio (`speed_ratio`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    """This rank's dispatch samples `start` up to `stop` (each dtype's), taken while one part of
    the calibration ran (`DispatchSampler.during`)."""

    start: int
    stop: int


def tp_at_speed(tp: TensorParallelDispatch | None, ratio: float) -> TensorParallelDispatch | None:
    """`tp` with every host figure scaled by `ratio` (`DispatchSampler.speed_ratio`)."""
    if tp is None:
        return None
    blocks = tuple(
        dataclasses.replace(b, fwd_s=b.fwd_s * ratio, bwd_s=b.bwd_s * ratio) for b in tp.blocks
    )
    return dataclasses.replace(
        tp, blocks=blocks, loss_fwd_s=tp.loss_fwd_s * ratio, loss_bwd_s=tp.loss_bwd_s * ratio
    )


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
