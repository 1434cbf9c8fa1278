"""One point of the search space: how a training step is split over the GPUs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Schedule(StrEnum):
    """Pipeline schedule (`none` when there is no pipeline)."""

    NONE = "none"
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"
    INTERLEAVED_ZB = "interleaved_zb"
    """Zero bubble ZB1P (Qi et al. 2023, arXiv 2401.10241 §3.1; torch
    `ScheduleInterleavedZeroBubble`): split backward, weight gradients fill the bubbles; v >= 1
    chunks per stage in a loop."""
    ZBV = "zbv"
    """Zero bubble ZB-V (Qi et al. 2023 §6; torch `ScheduleZBVZeroBubble`): two chunks per stage
    in a V (stage 0 holds the first and the last)."""
    DUALPIPEV = "dualpipev"
    """DualPipeV (DeepSeek-V3, arXiv 2412.19437 §3.2.1; torch `ScheduleDualPipeV`): V placement,
    forward of one chunk paired with the backward of the other, split backward at the end."""


class Recompute(StrEnum):
    """Activation recomputation policy (Korthikanti et al. 2022 §5)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    PER_LAYER = "per_layer"
    """Each block none, selective or full, chosen per pipeline stage by the recompute solver
    (`planner/cost/recompute.py`): the least recomputation that fits in memory."""


class MeshAxis(StrEnum):
    """Axes of the device mesh. Expert parallelism lives inside the `dp` axis."""

    PP = "pp"
    DP = "dp"
    CP = "cp"
    TP = "tp"


DEFAULT_MESH_ORDER: tuple[MeshAxis, ...] = (MeshAxis.PP, MeshAxis.DP, MeshAxis.CP, MeshAxis.TP)
"""Outermost to innermost, as torchtitan and Megatron order them: TP inside a node first."""


LOCALITY_RANK: dict[MeshAxis, int] = {
    MeshAxis.TP: 0,
    MeshAxis.CP: 1,
    MeshAxis.DP: 2,
    MeshAxis.PP: 3,
}
"""Which axis deserves the fastest links, when the cost model cannot tell mesh orders apart:
TP innermost (it communicates every layer, on the critical path), then CP (every attention
block), then DP, with PP (one activation per stage boundary) outermost (torchtitan's and
Megatron-LM's order). Ties between mesh orders break by this, never by axis name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    """Degrees and choices of one candidate plan."""

    dp: int
    """Data-parallel degree (replicas, or FSDP shards)."""
    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline stages."""
    cp: int = 1
    """Context-parallel degree (sequence split across ranks in attention)."""
    ep: int = 1
    """Expert-parallel degree (MoE only): a divisor of dp, or with `expert_tp` 1 a multiple of
    tp whose quotient divides dp (the experts' group then spans the TP ranks)."""
    expert_tp: int | None = None
    """Tensor-parallel degree of the experts (Megatron-Core's `expert_tensor_parallel_size`,
    torchtitan's `expert_tensor_parallel_degree`). None: tp, the experts split as the dense
    layers are. 1 (with tp > 1): each expert whole on one rank and the expert-parallel group
    folded over the TP ranks (MoE parallel folding, Liu et al. 2025, arXiv 2504.14960)."""
    zero_stage: int = 0
    """ZeRO stage 0-3 over the data-parallel (x context-parallel) group."""
    dp_shard: int | None = None
    """HSDP (Zhao et al. 2023, PyTorch FSDP §3.2.2 hybrid sharding): ZeRO-3 shards over groups of
    `dp_shard` consecutive dp ranks (x cp) and replicates across dp // dp_shard such groups,
    all-reducing the gradient shards between them. None: shard over the whole dp group."""
    offload_optimizer: bool = False
    """Optimizer states and step on the host (ZeRO-Offload)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism with TP (Korthikanti et al. 2022 §4.2.2)."""
    schedule: Schedule = Schedule.NONE
    """Pipeline schedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved 1F1B)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation policy for the blocks."""
    mesh_order: tuple[MeshAxis, ...] = DEFAULT_MESH_ORDER
    """Mesh axes from outermost to innermost (the last varies fastest over ranks)."""
    powersgd_rank: int | None = None
    """PowerSGD rank of the gradient all-reduce (Vogels et al. 2019; DDP's `powerSGD_hook`);
    None: uncompressed. Changes the training math: searched only with `--allow-compression`."""
    offload_params: bool = False
    """Sharded parameters and gradients on the host (ZeRO-Offload/Infinity style, FSDP2
    `CPUOffloadPolicy`; needs ZeRO-3 and optimizer offload): PCIe copies every unit."""
    offload_activations: bool = False
    """Activations the blocks keep for backward copied to the host and back (saved-tensor
    offload): PCIe copies every micro-batch, overlapped with neighbouring blocks."""
    async_pipeline: bool = False
    """PipeDream-2BW (Narayanan et al. 2021, arXiv 2006.09503): 1F1B without the flush, two
    weight versions, weight staleness 1. Changes the training math: only with `--allow-async`."""

    @property
    def shard_dp(self) -> int:
        """Data-parallel ranks one ZeRO shard group spans (dp unless HSDP)."""
        return self.dp if self.dp_shard is None else self.dp_shard

    @property
    def dp_replicate(self) -> int:
        """HSDP replica groups (1 unless HSDP)."""
        return self.dp // self.shard_dp if self.shard_dp else 1

    @property
    def fsdp_wrapped(self) -> bool:
        """Whether the executor wraps the model in FSDP2: ZeRO >= 2 over more than one
        data-parallel rank, or any offload (`executor/data_parallel.data_parallel_kind`)."""
        sharded = self.dp * self.cp > 1 and self.zero_stage >= 2
        return self.offload_optimizer or self.offload_params or sharded

    @property
    def dtensor_params(self) -> bool:
        """Whether the executor's parameters are DTensors: tensor parallel, FSDP2, or FSDP2's
        `replicate` (data parallel beside a pipeline); DDP's and a single rank's are plain."""
        return self.tp > 1 or self.fsdp_wrapped or (self.dp * self.cp > 1 and self.pp > 1)

    @property
    def folded_experts(self) -> bool:
        """Whether the expert-parallel group spans the TP ranks (`expert_tp` 1 beside tp > 1)."""
        return self.expert_tp == 1 and self.tp > 1

    @property
    def ep_dp(self) -> int:
        """Ranks of the data-parallel group the experts split over: ep, or ep // tp where the
        expert-parallel group is folded over the TP ranks. Each rank holds 1 / (tp * ep_dp) of
        the experts either way, and their gradients reduce over dp * cp / ep_dp ranks."""
        return max(1, self.ep // self.tp) if self.folded_experts else self.ep

    @property
    def world_size(self) -> int:
        """GPUs the strategy uses."""
        return self.dp * self.tp * self.pp * self.cp

    def axis_size(self, axis: MeshAxis) -> int:
        """Degree of a mesh axis."""
        size: int = getattr(self, axis.value)  # the fields are named after the axes
        return size

    def sort_key(self) -> tuple:
        """Deterministic tie-break between equally fast strategies."""
        return (
            self.tp,
            self.pp,
            self.cp,
            self.ep,
            self.folded_experts,
            self.dp,
            self.zero_stage,
            self.dp_replicate,
            self.offload_optimizer,
            not self.sequence_parallel,
            str(self.schedule),
            self.virtual_stages,
            -self.micro_batch_size,
            self.recompute == Recompute.PER_LAYER,
            str(self.recompute),
            tuple(LOCALITY_RANK[a] for a in reversed(self.mesh_order)),
            self.powersgd_rank or 0,
            self.offload_params,
            self.offload_activations,
            self.async_pipeline,
        )

    def short(
        self, *, num_microbatches: int | None = None, block_recompute: Sequence[Recompute] = ()
    ) -> str:
        """Compact one-line description, e.g. ``dp=8 tp=8 pp=16 zero=1 sp 1f1b mbs=1 rc=full``
        (the one formatter of strategies). A plan adds its micro-batches per replica
        (``m=64``) and each block's decision, summarized for a per-layer policy
        (``rc=per_layer(4xfull/8xnone)``)."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.folded_experts:
            parts.append("etp=1")
        parts.append(f"zero={self.zero_stage}")
        if self.dp_replicate > 1:
            parts.append(f"hsdp={self.dp_replicate}x{self.shard_dp}")
        if self.offload_optimizer:
            parts.append("offload")
        if self.sequence_parallel:
            parts.append("sp")
        if self.pp > 1:
            sched = str(self.schedule)
            looped = (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB)
            if self.schedule in looped and self.virtual_stages > 1:
                sched += f"(v={self.virtual_stages})"
            parts.append(sched + ("(async)" if self.async_pipeline else ""))
        if self.powersgd_rank is not None:
            parts.append(f"powersgd={self.powersgd_rank}")
        if self.offload_params:
            parts.append("offload_params")
        if self.offload_activations:
            parts.append("offload_acts")
        parts.append(f"mbs={self.micro_batch_size}")
        if num_microbatches is not None:
            parts.append(f"m={num_microbatches}")
        rc = f"rc={self.recompute}"
        if self.recompute == Recompute.PER_LAYER and block_recompute:
            counts = Counter(str(r) for r in block_recompute)
            rc += "(" + "/".join(f"{n}x{k}" for k, n in sorted(counts.items())) + ")"
        parts.append(rc)
        return " ".join(parts)
