"""The run report: measured step time, throughput and peak memory next to the plan's
predictions, as JSON and as a table."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass

import torch

from ..planner.calibration import recalibrate_hint
from ..planner.cost.estimate import TimeBreakdown
from ..planner.jsonio import write_atomic
from ..planner.plan import Plan
from ..planner.units import GIB, gib, seconds
from ..profiler.host_memory import HostPeak, peak_resident_bytes

RSS_SOURCE = "peak RSS of the process (getrusage ru_maxrss: tensors plus Python/torch runtime)"
HOST_SOURCE = (
    "resident memory less glibc's free bytes at the last step's start plus the peak rise of "
    "torch's CPU allocations over that step (profiled, not timed), as the plan prices it: "
    "the peak RSS also holds freed heap glibc keeps"
)
CUDA_SOURCE = (
    "torch.cuda.max_memory_allocated plus what lies outside torch's allocator at the end "
    "(CUDA context, NCCL and library buffers: total - free - reserved), as the plan's "
    "runtime_overhead_bytes prices it"
)


def peak_memory_bytes(device: torch.device, host: HostPeak | None = None) -> tuple[float, str]:
    """(peak bytes of this rank, what was measured). On the CPU, `host` is the profiled last
    step (`profiler.host_memory`); without one, the peak RSS."""
    if device.type == "cuda":
        # The prediction counts the runtime's own footprint (`runtime_overhead_bytes`), which
        # max_memory_allocated leaves out: add the device memory torch's allocator does not
        # hold, so both sides count the same things (one rank per GPU: nobody else's).
        free, total = torch.cuda.mem_get_info(device)
        outside = max(0, total - free - torch.cuda.memory_reserved(device))
        return float(torch.cuda.max_memory_allocated(device) + outside), CUDA_SOURCE
    if host is not None and host.events > 0:
        return host.live_peak_bytes, HOST_SOURCE
    return float(peak_resident_bytes()), RSS_SOURCE


def strategy_text(plan: Plan) -> str:
    """A one-line summary of the plan's strategy (`Plan.short`) and its precision."""
    return f"{plan.short()} {plan.train.precision}"


def rel_err(measured: float, predicted: float) -> float | None:
    """(measured - predicted) / predicted, None without a prediction."""
    return (measured - predicted) / predicted if predicted > 0 else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunReport:
    """Measured against predicted, for one run."""

    model: str
    """The plan's model name."""
    cluster: str
    """The plan's cluster name."""
    strategy: str
    """The plan's strategy in one line."""
    world_size: int
    """Ranks that ran."""
    device: str
    """Device kind (cpu or cuda)."""
    tokens_per_step: int
    """Global batch times sequence length."""
    steps_timed: int
    """Steps in the median (after warm-up)."""
    warmup_steps: int
    """Steps run but not timed."""
    step_time_s: float
    """Median step time over the timed steps (this rank's clock; steps end in collectives)."""
    step_time_min_s: float
    """Fastest timed step."""
    step_time_max_s: float
    """Slowest timed step."""
    tokens_per_s: float
    """tokens_per_step / step_time_s."""
    memory_source: str
    """What the peak memory figures measure."""
    peak_memory_bytes: tuple[float, ...]
    """Peak memory of each rank, by rank."""
    predicted_step_time_s: float
    """The plan's step time."""
    predicted_tokens_per_s: float
    """The plan's throughput."""
    predicted_memory_per_gpu_bytes: float
    """The plan's peak memory on the fullest device."""
    step_time_rel_err: float | None
    """(measured - predicted) / predicted step time."""
    tokens_per_s_rel_err: float | None
    """(measured - predicted) / predicted throughput."""
    memory_rel_err: float | None
    """(max measured over ranks - predicted) / predicted peak memory."""
    first_step: int
    """Index of the first step run (after a resume, > 0)."""
    peak_rss_bytes: tuple[float, ...] = ()
    """Peak RSS of each rank (CPU: above `peak_memory_bytes` by the heap glibc keeps)."""
    losses: tuple[float, ...]
    """Global-batch loss of each step run."""
    predicted_time_breakdown: TimeBreakdown | None = None
    """The plan's step time in parts (what `paraplan calibrate --from-run` refits part by
    part; None in reports from before 2026-11-28)."""
    host_probe_s: float | None = None
    """Rank 0's median seconds of the fixed host workload of `profiler/host_probe.py`, timed
    after the warm-up steps and after the last step (a CPU run; None on a GPU and in reports
    from before 2026-11-29): against other runs' figures, how fast the machine was."""

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON (atomically)."""
        write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


def make_report(
    plan: Plan,
    *,
    step_times_s: list[float],
    warmup_steps: int,
    memory_bytes: list[float],
    memory_source: str,
    device: str,
    first_step: int,
    losses: list[float],
    rss_bytes: list[float] | None = None,
    host_probe_s: float | None = None,
) -> RunReport:
    """Build the report from the timed steps (warm-up already removed) and per-rank memory."""
    if not step_times_s:
        raise ValueError(
            f"no timed steps: run more than the {warmup_steps} warm-up steps (e.g. --steps "
            f"{warmup_steps + 3})"
        )
    median = statistics.median(step_times_s)
    tokens = plan.train.global_batch * plan.train.seq_len
    pred = plan.predicted
    return RunReport(
        model=plan.model.name,
        cluster=plan.cluster.name,
        strategy=strategy_text(plan),
        world_size=len(memory_bytes),
        device=device,
        tokens_per_step=tokens,
        steps_timed=len(step_times_s),
        warmup_steps=warmup_steps,
        step_time_s=median,
        step_time_min_s=min(step_times_s),
        step_time_max_s=max(step_times_s),
        tokens_per_s=tokens / median,
        memory_source=memory_source,
        peak_memory_bytes=tuple(memory_bytes),
        predicted_step_time_s=pred.step_time_s,
        predicted_tokens_per_s=pred.tokens_per_s,
        predicted_memory_per_gpu_bytes=pred.memory_per_gpu_bytes,
        step_time_rel_err=rel_err(median, pred.step_time_s),
        tokens_per_s_rel_err=rel_err(tokens / median, pred.tokens_per_s),
        memory_rel_err=rel_err(max(memory_bytes), pred.memory_per_gpu_bytes),
        first_step=first_step,
        losses=tuple(losses),
        peak_rss_bytes=tuple(rss_bytes or ()),
        predicted_time_breakdown=pred.time_breakdown,
        host_probe_s=host_probe_s,
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def format_report(r: RunReport) -> str:
    """The report as a table (memory in GiB, as every output: `planner/units.py`)."""
    rows = [
        (
            "step time (median)",
            seconds(r.step_time_s),
            seconds(r.predicted_step_time_s),
            _pct(r.step_time_rel_err),
        ),
        (
            "tokens/s",
            f"{r.tokens_per_s:,.0f}",
            f"{r.predicted_tokens_per_s:,.0f}",
            _pct(r.tokens_per_s_rel_err),
        ),
        (
            "peak memory (max rank)",
            gib(max(r.peak_memory_bytes), 3),
            gib(r.predicted_memory_per_gpu_bytes, 3),
            _pct(r.memory_rel_err),
        ),
    ]
    width = max(len(row[0]) for row in rows)
    lines = [
        f"paraplan run report: {r.model} on {r.cluster} ({r.world_size} {r.device} ranks)",
        f"strategy: {r.strategy}",
        f"timed {r.steps_timed} steps after {r.warmup_steps} warm-up; "
        f"{r.tokens_per_step:,} tokens/step",
        "",
        f"{'metric':<{width}}  {'measured':>14}  {'predicted':>14}  {'rel. error':>10}",
    ]
    lines += [f"{a:<{width}}  {b:>14}  {c:>14}  {d:>10}" for a, b, c, d in rows]
    lines.append(
        f"step times from {seconds(r.step_time_min_s)} to {seconds(r.step_time_max_s)} over "
        "the timed steps"
    )
    per_rank = ", ".join(f"r{i} {b / GIB:,.3f}" for i, b in enumerate(r.peak_memory_bytes))
    lines += [
        "",
        f"peak memory per rank (GiB): {per_rank}",
        f"memory measured as {r.memory_source}",
    ]
    if r.device == "cpu" and r.peak_rss_bytes and r.memory_source != RSS_SOURCE:
        kept = max(r.peak_rss_bytes) - max(r.peak_memory_bytes)
        lines.append(
            f"peak RSS (max rank) {gib(max(r.peak_rss_bytes), 3)}: {kept / GIB:+,.3f} GiB "
            "of it is freed heap glibc keeps (its retention; MALLOC_ARENA_MAX, "
            "MALLOC_TRIM_THRESHOLD_ or jemalloc change it)"
        )
    if r.losses:
        lines.append(
            f"loss: step {r.first_step} {r.losses[0]:.4f} -> step "
            f"{r.first_step + len(r.losses) - 1} {r.losses[-1]:.4f}"
        )
    hint = recalibrate_hint(r.step_time_rel_err, r.cluster)
    if hint is not None:
        lines += ["", f"note: {hint}"]
    return "\n".join(lines)
