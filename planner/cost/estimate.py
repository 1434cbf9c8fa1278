"""What the cost model predicts for a strategy: the step-time breakdown and the estimate."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategy import Strategy
from ..units import gib
from .memory import MemoryBreakdown


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdown:
    """Where a step's time goes, on the pipeline stage that bounds it (seconds)."""

    compute_s: float
    """Forward and backward compute of every micro-batch."""
    recompute_s: float
    """Forward recomputation in backward."""
    comm_s: float
    """Exposed (not overlapped) communication: TP, CP, EP, PP, ZeRO and gradient sync."""
    bubble_s: float
    """Pipeline fill and drain."""
    optimizer_s: float
    """Optimizer step (on the host when offloaded, with its PCIe transfers)."""

    @property
    def step_time_s(self) -> float:
        """Sum of the parts."""
        return self.compute_s + self.recompute_s + self.comm_s + self.bubble_s + self.optimizer_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Replay:
    """A step replayed operation by operation under the cost model (`planner/replay.py`)."""

    step_time_s: float
    """Seconds from the first forward to the end of the optimizer step."""
    peak_memory_bytes: float
    """Largest memory of any GPU during the step."""
    peak_stage: int
    """Pipeline stage of that GPU."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTime:
    """Seconds one pipeline stage spends per micro-batch, and once per step."""

    stage: int
    """Pipeline stage (the first of those that look exactly like it)."""
    fwd_s: float
    """Forward compute per micro-batch."""
    bwd_s: float
    """Backward compute per micro-batch."""
    recompute_s: float
    """Recomputation per micro-batch."""
    comm_s: float
    """Exposed communication per micro-batch (TP, CP, EP, PP and per-micro-batch ZeRO)."""
    tail_comm_s: float
    """Exposed communication once per step (gradient reduction, parameter gathers)."""
    optimizer_s: float
    """Optimizer step."""

    @property
    def per_microbatch_s(self) -> float:
        """One micro-batch's forward and backward with everything they wait for: a slot."""
        return self.fwd_s + self.bwd_s + self.recompute_s + self.comm_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The cost model's predictions for one strategy."""

    strategy: Strategy
    """What was evaluated."""
    num_microbatches: int
    """Micro-batches per step per data-parallel replica."""
    step_time_s: float
    """Seconds per optimizer step."""
    tokens_per_s: float
    """Training throughput over the whole cluster."""
    mfu: float
    """Model FLOPs utilization: model FLOPs (no recompute) / (time * GPUs * peak); PaLM App. B."""
    memory: MemoryBreakdown
    """Memory of the GPU that holds the most (its pipeline stage: `peak_stage`)."""
    peak_stage: int
    """Pipeline stage with the largest memory."""
    capacity_bytes: float
    """Usable memory per GPU (capacity less headroom)."""
    bubble_fraction: float
    """Share of the pipeline's time that is fill and drain."""
    exposed_comm_s: float
    """Seconds of communication not hidden behind compute."""
    time: TimeBreakdown
    """Time breakdown on the bounding stage."""

    @property
    def feasible(self) -> bool:
        """Whether the peak memory fits in the usable memory."""
        return self.memory.total_bytes <= self.capacity_bytes

    @property
    def reason(self) -> str:
        """Why the strategy is infeasible ('' when it fits)."""
        if self.feasible:
            return ""
        return (
            f"needs {gib(self.memory.total_bytes)} per GPU on stage {self.peak_stage}, "
            f"more than the {gib(self.capacity_bytes)} usable"
        )
