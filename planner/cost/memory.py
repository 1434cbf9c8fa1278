"""Memory per GPU: model states by ZeRO stage, activations by TP/SP/CP and recompute policy,
in-flight micro-batches by pipeline schedule, and buffers."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import TrainConfig
from ..model import LayerCost, LayerKind, ModelProfile
from ..strategy import Recompute, Schedule
from . import schedules as split_schedules
from .eager import LOSS_BYTES

BUCKETS_IN_FLIGHT = 2
"""DDP / ZeRO-1/2 gradient buckets (`DDP_BUCKET_BYTES`) in flight: one filling while one
reduces."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on one GPU at its peak, by what holds them."""

    params_bytes: float
    """Working parameters (16-bit in mixed precision)."""
    grads_bytes: float
    """Gradients."""
    optimizer_bytes: float
    """Optimizer states and fp32 master weights."""
    activations_bytes: float
    """Activations saved for backward, for every in-flight micro-batch."""
    other_bytes: float
    """Runtime context, communication buffers, unsharded FSDP layers."""

    @property
    def total_bytes(self) -> float:
        """Sum of every part."""
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.other_bytes
        )


def model_state_bytes(
    num_params: float,
    *,
    shard_ranks: int,
    zero_stage: int,
    train: TrainConfig,
    offload_optimizer: bool = False,
) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for `num_params` parameters replicated over
    `shard_ranks` data-parallel ranks (Rajbhandari et al. 2019 §5, Figure 1: stage 1 shards
    optimizer states, stage 2 also gradients, stage 3 also parameters)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r} must be 0, 1, 2 or 3")
    n = max(1, shard_ranks)
    params = num_params * train.param_bytes / (n if zero_stage >= 3 else 1)
    grads = num_params * train.grad_bytes / (n if zero_stage >= 2 else 1)
    optimizer = (
        0.0
        if offload_optimizer
        else (num_params * train.optimizer_bytes / (n if zero_stage >= 1 else 1))
    )
    return params, grads, optimizer


def held_zero_stage(zero_stage: int, pipelined: bool) -> int:
    """The ZeRO stage whose parameters and gradients a pipeline stage really holds: ZeRO-2/3
    beside a pipeline hold what ZeRO-1 holds. torch.distributed.pipelining runs every backward
    but the step's last with FSDP2's gradient reduction and resharding off (stage.py,
    `backward_maybe_with_nosync`: `set_requires_gradient_sync(False)`,
    `set_reshard_after_backward(False)`) and reduces once after all micro-batches
    (`perform_reduce_grad`), so whole parameters and whole fp32 gradients stay on each rank;
    torchtitan keeps parameters unsharded after forward under PP; DeepSpeed refuses ZeRO-2/3
    with its pipeline engine; Megatron-LM's distributed optimizer is ZeRO-1. Measured with the
    executor (gpt-small, dp=2 x pp=2, 4 gloo ranks, 4 micro-batches, 2026-11-26): ZeRO-3's
    peak 796 MB against ZeRO-1's 776 MB, where ZeRO-3's sharding was priced 69 MB lower.
    Optimizer states stay sharded."""
    return min(zero_stage, 1) if pipelined else zero_stage


GATHERED_INPUTS = 2
"""Block-input-sized tensors a transformer block all-gathers under sequence parallelism: the
attention's input and the MLP's (Korthikanti et al. 2022 §4.2.2, Figure 5's g operators)."""


def layer_act_bytes(
    layer: LayerCost,
    *,
    tp: int,
    sp: bool,
    cp: int,
    recompute: Recompute,
    saves_gathered: bool = False,
    fused_norms: bool = False,
    fused_glu: bool = False,
) -> float:
    """Bytes one layer keeps for backward per sequence (Korthikanti et al. 2022 Table 2):
    TP shards the `act_tp_bytes` part, SP also the replicated part; CP splits the sequence;
    selective recompute drops the attention core; full recompute keeps only the input.
    `saves_gathered` (`Runtime.sp_saves_gathered_input`): under SP a block's attention and MLP
    keep their all-gathered inputs whole, two block-input-sized tensors, instead of the
    sequence shards Megatron-LM keeps and gathers again in backward (§4.2.2). `fused_norms`,
    `fused_glu` (`Runtime.norm_keeps_input_only`, `glu_keeps_input_only`): the layer's norms
    and gated MLP keep their inputs only (`LayerCost.act_norm_copy_bytes`, `act_glu_copy_bytes`
    not kept)."""
    rep_div = tp if sp else 1
    if layer.kind == LayerKind.BLOCK and recompute == Recompute.FULL:
        return layer.input_bytes / rep_div / cp
    tp_part = layer.act_tp_bytes
    if layer.kind == LayerKind.BLOCK and recompute == Recompute.SELECTIVE:
        tp_part -= layer.act_attn_core_bytes
    if fused_glu:
        tp_part -= layer.act_glu_copy_bytes
    replicated = layer.act_replicated_bytes
    if fused_norms:
        replicated -= layer.act_norm_copy_bytes
    kept = tp_part / tp + replicated / rep_div
    if saves_gathered and sp and tp > 1 and layer.kind == LayerKind.BLOCK:
        kept += GATHERED_INPUTS * layer.input_bytes * (1 - 1 / tp)
    return kept / cp


LOSS_BACKWARD_BUFFERS = 2
"""fp32 logits-sized buffers torch's cross-entropy (`log_softmax` + `nll_loss`) holds at the
peak of its backward beyond the log-probabilities it keeps for it (the head's kept bytes count
those): `nll_loss_backward`'s gradient and `_log_softmax_backward_data`'s. Measured with the
torch profiler's memory events on the executor's gpt-small step (DDP, 2 gloo ranks, fp32 and
bf16 under autocast, 2026-11-25): the peak stood 3 logits buffers above the level before the
logits, in both precisions (the bf16 logits and their fp32 copy are freed by then)."""

LOSS_PARALLEL_BACKWARD_BUFFERS = 3
"""The same under torch's `loss_parallel` (vocabulary-sharded logits, tp > 1; as the executor
and torchtitan run it): its DTensor handlers are unfused, and `nll_loss_backward`'s handler
holds the kept log-probabilities, a zeroed gradient, `exp` of the log-probabilities and one more
intermediate at once (torch/distributed/tensor/_ops/_math_ops.py, torch 2.13; the profiler's
memory events name `zeros_like`, `exp`, `add`, then `mul`). Measured as above on the TP+SP
gpt-small step: the peak stood 4 logits shards above the level before the logits (fp32 and
bf16), where the plain loss stands at 3."""


def layer_tmp_bytes(
    layer: LayerCost, p: ModelProfile, *, act_scale: float, tp: int, cp: int, torch_loss: bool
) -> float:
    """A layer's transient peak per sequence on one rank: its profiled forward/backward peak
    (in the training dtype: `act_scale`), sharded by TP and CP. The head's is at least what
    torch's cross-entropy holds at its backward's peak beyond the kept log-probabilities when
    the framework runs it (`Runtime.torch_loss`): the profile traced a model's own loss, not
    the framework's, and an analytic spec has none. The embedding's is its forward's only: its
    backward's is per micro-batch, not per sequence (`step_tmp_bytes`)."""
    if layer.kind == LayerKind.EMBEDDING:  # its backward's: weight-sized, `step_tmp_bytes`
        return layer.fwd_tmp_bytes * act_scale / (tp * cp)
    tmp = max(layer.fwd_tmp_bytes, layer.bwd_tmp_bytes) * act_scale / (tp * cp)
    if layer.kind == LayerKind.HEAD and torch_loss:
        buffers = LOSS_PARALLEL_BACKWARD_BUFFERS if tp > 1 else LOSS_BACKWARD_BUFFERS
        tmp = max(tmp, buffers * LOSS_BYTES * p.seq_len * p.vocab / (tp * cp))
    return tmp


def step_tmp_bytes(layer: LayerCost, *, act_scale: float, tp: int) -> float:
    """A layer's transient that does not grow with the micro-batch, per micro-batch on one
    rank: the embedding's backward writes its tables' dense gradients (`embedding_dense_backward`)
    and, when the head shares the table, their sum, vocabulary x hidden tensors whatever the
    batch (sharded over the vocabulary by TP, not by CP). The profile keeps that peak whole
    (`LayerCost.bwd_tmp_bytes`, schema 5). Measured on the executor's gpt-small step with the
    torch profiler's memory events (2026-11-25): 12 MiB tensors at any micro-batch, where
    pricing the profiled transient per sequence gave 94 MiB at 4 sequences. 0 for other
    layers."""
    if layer.kind != LayerKind.EMBEDDING:
        return 0.0
    return layer.bwd_tmp_bytes * act_scale / tp


def step_tmps(layers: tuple[LayerCost, ...], act_scale: float, tp: int) -> tuple[float, ...]:
    """`step_tmp_bytes` of every layer of the chain."""
    return tuple(step_tmp_bytes(x, act_scale=act_scale, tp=tp) for x in layers)


MIN_SPLIT_IN_FLIGHT = 1.0
"""Micro-batches a stage of a split-backward schedule holds at its peak, at the least
(`in_flight_microbatches` never counts fewer): the first micro-batch runs its forward through
every chunk of the model before any of its backward (each chunk's waits for the next
chunk's), and a chunk keeps its activations from its forward's start to the end of its
backward or weight gradient, so when that micro-batch starts its forward on a stage's last
chunk the stage holds it on all of its chunks (tests/test_search_memory_bound.py)."""


def head_in_flight(schedule: Schedule, inflight: float) -> float:
    """Micro-batches whose head (and loss) activations the last stage holds at its peak, given
    the `inflight` it holds of the whole stage. Under interleaved 1F1B the head sits in the last
    stage's last chunk, whose forward of a micro-batch runs right before that chunk's backward of
    it (Megatron-LM's order, and torch's `ScheduleInterleaved1F1B`): it holds one at a time,
    while the stage's other chunks hold pp each at the peak ((v - 1) pp + 1 chunk micro-batches
    in all; tests/test_head_in_flight.py replays torch's order). Every other schedule holds the
    head's as many as the stage's (1F1B's last stage: one)."""
    return min(1.0, inflight) if schedule == Schedule.INTERLEAVED_1F1B else inflight


def in_flight_microbatches(
    schedule: Schedule, *, pp: int, stage: int, num_microbatches: int, virtual_stages: int
) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage.

    GPipe holds all m (Huang et al. 2019 §2.2); 1F1B holds min(pp - stage, m) (Narayanan et al.
    2021 §2.2.1); interleaved 1F1B holds (pp - stage - 1) * 2 + (v - 1) * pp + 1 chunk
    micro-batches (Megatron-LM's warm-up count), i.e. pp + (pp - 1)/v stages' worth on stage 0
    (Korthikanti et al. 2022 §4.2.3)."""
    m = num_microbatches
    if split_schedules.is_split_backward(schedule):  # zero bubble, DualPipeV (schedules.py)
        return split_schedules.in_flight_microbatches(
            schedule, pp=pp, stage=stage, num_microbatches=m, virtual_stages=virtual_stages
        )
    if schedule == Schedule.NONE:
        return 1.0
    if schedule == Schedule.GPIPE:
        return float(m)
    if schedule == Schedule.ONE_F_ONE_B:
        return float(min(pp - stage, m))
    v = virtual_stages
    chunk_mbs = min((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v)
    return chunk_mbs / v
