"""`paraplan calibrate --from-run`: a calibration refitted on the executor's run reports.

Each report holds the measured step time and the plan's prediction split into its parts
(`TimeBreakdown`: compute, recompute and the pipeline's bubble, which is compute waited for;
exposed communication; the optimizer step). A single scale on every predicted second cannot
tell a machine whose links run slower than the microbenchmarks said from one whose kernels
do, and the strategies of one job share those parts differently (on this VM a tiny GPT-2's
TP+SP step is 42% communication, its DDP step 8%). So the refit fits three scales, one per
part, by least squares on the relative errors of the reports, each drawn towards the common
scale (`RIDGE`): with one report, or with reports whose parts move together, they stay the
common scale; with reports that differ in their shares, each part's scale moves as far as
they show. Reports from before 2026-11-28, without their parts, refit the common scale only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .calibration import Calibration
from .hardware import get_accelerator, with_calibration

RIDGE = 0.1
"""Weight of each part's pull towards the common scale, per squared relative deviation: a
part's scale 30% off the common one costs as much as one report 9.5% off, so it moves only
as far as several reports support (least squares on relative errors, Tikhonov 1963)."""
SCALE_RANGE = 4.0
"""A part's scale stays within this factor of the common scale (a guard against reports
that pin a part badly: its share near zero in all of them)."""
BANDWIDTH_FIGURES = ("memory_bw_bytes_per_s", "pcie_bw_bytes_per_s")
"""Compute-side rates a refit divides by the compute scale (kernel times multiply)."""
LINK_BANDWIDTH_FIGURES = ("intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s")
"""Link rates it divides by the communication scale."""
LATENCY_FIGURES = ("intra_node_latency_s", "inter_node_latency_s")
"""Link latencies it multiplies by the communication scale."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictedParts:
    """A plan's predicted step split as the refit scales it (seconds)."""

    compute_s: float
    """Compute, recompute and pipeline bubble: the kernels' time."""
    comm_s: float
    """Exposed communication."""
    optimizer_s: float
    """The optimizer step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSample:
    """What a refit reads from one run report."""

    step_time_s: float
    """Measured median step time."""
    predicted_step_time_s: float
    """The plan's step time."""
    peak_memory_bytes: float
    """Measured peak memory of the fullest rank."""
    predicted_memory_bytes: float
    """The plan's peak memory per device."""
    parts: PredictedParts | None = None
    """The plan's step time in parts (None: a report from before 2026-11-28)."""
    host_probe_s: float | None = None
    """The run's fixed host workload time (`profiler/host_probe.py`; None: a GPU run, or a
    report from before 2026-11-29)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Scales:
    """Multipliers on the reports' predicted seconds, by part."""

    compute: float
    """On kernels (compute, recompute, bubble) and every other term but the two below."""
    comm: float
    """On communication."""
    optimizer: float
    """On the optimizer step."""

    def predict_s(self, sample: RunSample) -> float:
        """`sample`'s predicted step time under these scales."""
        p = sample.parts
        if p is None:
            return sample.predicted_step_time_s * self.compute
        return self.compute * p.compute_s + self.comm * p.comm_s + self.optimizer * p.optimizer_s


def run_sample(report: Mapping[str, Any], *, origin: str) -> RunSample:
    """The figures a refit needs from a run report's JSON (`executor/report.py`)."""
    try:
        parts = _parts(report.get("predicted_time_breakdown"))
        sample = RunSample(
            step_time_s=float(report["step_time_s"]),
            predicted_step_time_s=float(report["predicted_step_time_s"]),
            peak_memory_bytes=float(max(report["peak_memory_bytes"])),
            predicted_memory_bytes=float(report["predicted_memory_per_gpu_bytes"]),
            parts=parts,
            host_probe_s=_probe(report.get("host_probe_s")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{origin} is not a run report (missing or bad {err}); pass the JSON that "
            "train_gpt2.py --report (paraplan run) writes"
        ) from None
    values = (
        sample.step_time_s,
        sample.predicted_step_time_s,
        sample.peak_memory_bytes,
        sample.predicted_memory_bytes,
    )
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{origin}: step times and memory must be positive numbers")
    return sample


def _probe(value: object) -> float | None:
    """A report's `host_probe_s`: None, or a finite number of seconds > 0 (ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"host_probe_s={value!r}: seconds must be a number")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"host_probe_s={value!r}: seconds must be a finite number > 0")
    return seconds


SLOW_PROBE = 1.2
"""A run whose host probe took more than this times the runs' median ran on a slow machine
(the VM's two speeds read about 1.9x apart in the probe, 2026-11-29)."""


def machine_note(samples: list[RunSample]) -> str | None:
    """How fast the machine was in each of the reports' runs against the others: the runs
    whose fixed host workload (`RunReport.host_probe_s`) took over `SLOW_PROBE` times the
    runs' median, beside their step-time errors and the other runs'; None with fewer than two
    runs that timed it (a GPU run, a report from before 2026-11-29)."""
    pairs = [
        (s.host_probe_s, s.step_time_s / s.predicted_step_time_s - 1.0)
        for s in samples
        if s.host_probe_s is not None
    ]
    if len(pairs) < 2:
        return None
    median_s = statistics.median(p for p, _ in pairs)
    slow = [e for p, e in pairs if p > SLOW_PROBE * median_s]
    rest = [e for p, e in pairs if p <= SLOW_PROBE * median_s]
    head = (
        f"a fixed host workload, timed in each of {len(pairs)} runs, took {median_s * 1e3:.2f} ms"
    )
    if not slow:
        return (
            f"the machine ran alike in these runs: {head} (median), within "
            f"{SLOW_PROBE:g}x of it in every one"
        )
    return (
        f"the machine ran slow in {len(slow)} of these runs: {head} (median) and over "
        f"{SLOW_PROBE:g}x that in them; their step times against their predictions "
        f"{statistics.median(slow):+.0%} (median), the other runs' {statistics.median(rest):+.0%}: "
        "a refit learns whatever state its runs caught, so run those again or leave them out"
    )


def _parts(breakdown: object) -> PredictedParts | None:
    """A report's `predicted_time_breakdown` (`TimeBreakdown` as JSON) as the refit's parts;
    None when the report has none. ValueError on a part that is not a finite number >= 0."""
    if breakdown is None:
        return None
    if not isinstance(breakdown, Mapping):
        raise ValueError("predicted_time_breakdown")
    names = ("compute_s", "recompute_s", "bubble_s", "comm_s", "optimizer_s")
    got = {name: float(breakdown[name]) for name in names}
    if not all(math.isfinite(v) and v >= 0 for v in got.values()):
        raise ValueError("predicted_time_breakdown")
    return PredictedParts(
        compute_s=got["compute_s"] + got["recompute_s"] + got["bubble_s"],
        comm_s=got["comm_s"],
        optimizer_s=got["optimizer_s"],
    )


def fit_scales(samples: Iterable[RunSample]) -> Scales:
    """The scales that best turn the reports' predictions into their measurements: the
    common scale (the geometric mean of measured over predicted, which minimizes the mean
    squared log error) where no report has its parts; else three scales by least squares on
    the relative errors, each drawn towards the common scale (`RIDGE`, module docstring) and
    kept within `SCALE_RANGE` of it."""
    runs = list(samples)
    if not runs:
        raise ValueError("no run reports to refit on; pass one or more report JSON files")
    common = math.exp(
        statistics.fmean(math.log(r.step_time_s / r.predicted_step_time_s) for r in runs)
    )
    parted = [r for r in runs if r.parts is not None]
    if not parted:
        return Scales(compute=common, comm=common, optimizer=common)
    rows = [
        [p.compute_s / r.step_time_s, p.comm_s / r.step_time_s, p.optimizer_s / r.step_time_s]
        for r in parted
        if (p := r.parts) is not None
    ]
    pull = math.sqrt(RIDGE) / common
    a = np.array([*rows, *(np.eye(3) * pull)])
    b = np.array([1.0] * len(rows) + [math.sqrt(RIDGE)] * 3)
    solved = np.linalg.lstsq(a, b, rcond=None)[0]
    low, high = common / SCALE_RANGE, common * SCALE_RANGE
    compute, comm, optimizer = (min(high, max(low, float(x))) for x in solved)
    return Scales(compute=compute, comm=comm, optimizer=optimizer)


def refit(
    calibration: Calibration, samples: Iterable[RunSample], *, accelerator: str
) -> tuple[Calibration, Scales]:
    """The calibration refitted on run reports of a cluster of `accelerator`s, and the
    scales found (`fit_scales`, on the reports' predicted seconds): the kernels and every
    compute-side figure by the compute scale (`time_scale`), the measured links, the catalog
    link figures and the sync skew by the communication scale (`comm_scale` on top), the
    optimizer step by its own (`optimizer_scale` on top); the runtime's memory moves by the
    median of measured less predicted peak memory (the process's own footprint, which the
    microbenchmarks only estimate)."""
    runs = list(samples)
    scales = fit_scales(runs)
    memory_gap = statistics.median(r.peak_memory_bytes - r.predicted_memory_bytes for r in runs)
    acc = with_calibration(get_accelerator(accelerator), calibration.figures)
    figures = dict(calibration.figures)
    figures["peak_flops"] = {d: f / scales.compute for d, f in acc.peak_flops.items()}
    figures |= {name: getattr(acc, name) / scales.compute for name in BANDWIDTH_FIGURES}
    figures |= {name: getattr(acc, name) / scales.comm for name in LINK_BANDWIDTH_FIGURES}
    figures |= {name: getattr(acc, name) * scales.comm for name in LATENCY_FIGURES}
    figures["runtime_overhead_bytes"] = max(1, round(acc.runtime_overhead_bytes + memory_gap))
    new = dataclasses.replace(
        calibration,
        figures=figures,
        time_scale=calibration.time_scale * scales.compute,
        comm_scale=calibration.comm_scale * scales.comm / scales.compute,
        optimizer_scale=calibration.optimizer_scale * scales.optimizer / scales.compute,
        refit_runs=calibration.refit_runs + len(runs),
    )
    return new, scales


def refit_errors(samples: list[RunSample], scales: Scales) -> tuple[float, float]:
    """Mean |measured / predicted - 1| before and after the reports' predictions are scaled
    by `scales`."""
    before = statistics.fmean(abs(s.step_time_s / s.predicted_step_time_s - 1) for s in samples)
    after = statistics.fmean(abs(s.step_time_s / scales.predict_s(s) - 1) for s in samples)
    return before, after
