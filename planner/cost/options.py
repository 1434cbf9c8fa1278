"""The options that trade memory, time or the training math: PowerSGD compression
(`compression.py`), parameter and activation offload (`offload.py`) and the asynchronous
pipeline (PipeDream-2BW, below). Their memory terms, their validity, and the hidden costs
`paraplan explain` shows.

PipeDream-2BW (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training",
arXiv 2006.09503, §3): 1F1B without the pipeline flush. Each stage keeps two versions of its
weights (the one in-flight micro-batches started with, and the newest), so the step has no
fill-and-drain bubble in steady state; gradients are applied with a delay of one step
(weight staleness 1, §3.1: W(t+1) = W(t) - lr * grad f(W(t-1))). Memory: one more copy of the
stage's working parameters (the stashed version); activations as 1F1B (§3.2).
"""

from __future__ import annotations

from dataclasses import replace

from ..config import TrainConfig
from ..hardware import Accelerator
from ..strategy import Schedule, Strategy
from .compression import MAX_POWERSGD_RANK, PowerSGDModel, compressed
from .layout import Stage
from .memory import MemoryBreakdown
from .offload import OffloadModel, offload_problem
from .stages import Policy, StageModel

HOST_MEMORY_BYTES_PER_GPU = 2e12 / 8
"""Host memory per GPU an offloaded plan may fill: an NVIDIA DGX H100 has 2 TB of system
memory for 8 GPUs (DGX H100 datasheet). An assumption for every catalog accelerator: ZeRO-
Infinity's CPU tier is bounded by it (Rajbhandari et al. 2021 §4); with smaller hosts, pin
offload_params=false (`paraplan explain` prints what a plan puts on the host)."""
ASYNC_STALENESS_STEPS = 1
"""Weight staleness of PipeDream-2BW: gradients computed on the weights of one step before
(Narayanan et al. 2021 §3.1)."""


def has_options(s: Strategy) -> bool:
    """Whether the strategy takes any of these options."""
    return (
        s.powersgd_rank is not None or s.offload_params or s.offload_activations or s.async_pipeline
    )


def option_problem(s: Strategy) -> str | None:
    """Why the strategy's options cannot go together with the rest (None when they can)."""
    if s.powersgd_rank is not None:
        if not 1 <= s.powersgd_rank <= MAX_POWERSGD_RANK:
            return (
                f"powersgd_rank={s.powersgd_rank} must be a positive integer of at most "
                f"{MAX_POWERSGD_RANK} (a rank near the matrices' width compresses nothing)"
            )
        if s.zero_stage > 1:
            return (
                f"powersgd_rank={s.powersgd_rank} with zero_stage={s.zero_stage}: PowerSGD "
                "compresses DDP's gradient all-reduce (ZeRO 0 or 1), not a ZeRO-2/3 "
                "reduce-scatter; use --fix zero=0 or drop powersgd_rank"
            )
        if s.dp * s.cp == 1:
            return (
                f"powersgd_rank={s.powersgd_rank} with dp=1, cp=1: there is no gradient "
                "all-reduce to compress; use more data-parallel ranks or drop powersgd_rank"
            )
    if s.async_pipeline and (s.pp == 1 or s.schedule != Schedule.ONE_F_ONE_B):
        return (
            f"async_pipeline with pp={s.pp}, schedule {str(s.schedule)!r}: PipeDream-2BW is 1F1B "
            "without the flush; use --fix schedule=1f1b with pp > 1"
        )
    return offload_problem(s)


class OptionModel:
    """Memory and cost terms of the options for one stage model."""

    def __init__(self, stage_model: StageModel, train: TrainConfig, acc: Accelerator) -> None:
        self.train = train
        self.powersgd = PowerSGDModel(
            stage_model.profile, stage_model.flops_per_s, acc.memory_bw_bytes_per_s
        )
        self.offload = OffloadModel(stage_model, train, acc)

    def error_feedback_bytes(self, s: Strategy, stage: Stage) -> float:
        """PowerSGD's residual buffer and P, Q (0 without PowerSGD)."""
        r = s.powersgd_rank
        if r is None:
            return 0.0
        elems = 0.0
        for rows, cols in self.powersgd.stage_matrices(stage, s.tp):
            if compressed(rows, cols, r):
                elems += rows * cols + (rows + cols) * r
        return min(elems, 2 * stage.dense_params / s.tp) * self.train.grad_bytes

    def host_bytes(self, s: Strategy, num_params: float) -> float:
        """Host bytes per GPU of the model states parameter offload puts there (parameters,
        gradients and optimizer states of the rank's ZeRO-3 shard, an even split over
        tp x pp x dp x cp); 0 without parameter offload."""
        if not s.offload_params:
            return 0.0
        t = self.train
        shard = num_params / (s.tp * s.pp * s.dp * s.cp)
        return shard * (t.optimizer_bytes + t.param_bytes + t.grad_bytes)

    def memory(
        self, s: Strategy, stage: Stage, mem: MemoryBreakdown, inflight: float, policy: Policy
    ) -> MemoryBreakdown:
        """The stage's memory `mem` with every option's term."""
        mem = self.offload.memory(s, stage, mem, inflight, policy)
        extra = self.error_feedback_bytes(s, stage)
        if s.async_pipeline:  # the stashed weight version (PipeDream-2BW §3.2)
            extra += mem.params_bytes
        return replace(mem, other_bytes=mem.other_bytes + extra)
