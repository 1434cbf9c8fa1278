"""Autocast's own work in mixed-precision training, as the executor runs it without FSDP2.

Under DDP or on a single rank the executor keeps fp32 weights and runs each micro-batch under
`torch.autocast` (`executor/compose.py`): every matmul casts its fp32 weight to bf16/fp16
(read 4 bytes, write 2), the backward casts each weight's gradient back to fp32 (read 2, write
4), and `AccumulateGrad` adds it into the fp32 `.grad` (read 4 + 4, write 4): 24 bytes per
parameter per micro-batch that a profile traced in the compute dtype does not hold (its weights
are already bf16, its gradients accumulate in bf16). FSDP2's `MixedPrecisionPolicy` casts at
the gather instead (not priced here). Measured with `torch.profiler` over one micro-batch of a
1.24B-parameter Llama on an H200 (4 x 2048 tokens, 2026-11-26): the casts 7.7 ms and the fp32
gradient additions 9.6 ms, about 5% of its 180 ms (these bytes price ~9 ms at the calibrated
bandwidth: the additions also count fp32 residual adds).

Priced only on a calibrated device with a traced profile (`cost/eager.py`), whose other
memory-bound work is priced the same way; the catalog's block model is fitted to published
runs (Megatron keeps bf16 weights and fp32 main gradients, a different mechanism).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import FP32_BYTES, Precision
from ..model import LayerCost, LayerKind, ModelProfile
from ..strategy import Recompute, Strategy
from .layout import Stage
from .stages import Policy, StageModel

AUTOCAST_BYTES_PER_PARAM = 24
"""Bytes streamed per parameter per micro-batch (module docstring: 6 + 6 + 12)."""
AUTOCAST_FORWARD_SHARE = 0.25
"""Of those, the forward's (the weight casts); the backward has the rest."""


def autocasts(s: Strategy) -> bool:
    """Whether the executor runs `s` under `torch.autocast`: no FSDP2 (whose policy casts),
    and either a single data-parallel rank or DDP (no TP or PP beside data parallelism, which
    run FSDP2's `replicate`): `executor/data_parallel.DataParallelKind.autocasts`."""
    return not s.fsdp_wrapped and _autocast_shape(s)


def _autocast_shape(s: Strategy) -> bool:
    """One data-parallel rank, or data parallelism alone (DDP): the shapes that autocast
    unless FSDP2 wraps them."""
    return s.dp * s.cp == 1 or (s.tp == 1 and s.pp == 1)


def autocast_s(s: Strategy, stage: Stage, sm: StageModel) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of autocast's casts and fp32 gradient
    accumulation on one rank of `stage`; 0 where the executor does not autocast or the layers
    are not priced op by op (`StageModel.op_by_op_kernels`).

    Autocast caches the casts of leaf weights until its outermost context exits. The executor
    opens one per micro-batch without a pipeline (backward outside it), but runs a pipeline's
    whole `schedule.step` in one (`executor/compose.py`): there each weight is cast once per
    step, not once per micro-batch (torch's profiler, one Linear, 4 micro-batches, torch 2.13:
    22 `_to_copy` in one context against 28 in four: 3 x weight and bias fewer). The backward's
    casts and fp32 additions stay per micro-batch."""
    first = sm.profile.layers[stage.layers[0]]
    k = sm.op_by_op_kernels(first)
    if k is None or sm.train.precision == Precision.FP32 or not autocasts(s):
        return 0.0, 0.0
    params = stage.dense_params / s.tp + stage.expert_params / (s.tp * s.ep_dp)
    tensors = stage.param_tensors
    t = k.stream_s(params * AUTOCAST_BYTES_PER_PARAM, params * FP32_BYTES / max(1, tensors))
    per_step = sm.num_microbatches(s) if weights_cached(s) else 1  # weight casts per context
    return AUTOCAST_FORWARD_SHARE * t / per_step, (1 - AUTOCAST_FORWARD_SHARE) * t


def residual_widening(s: Strategy, sm: StageModel) -> float:
    """How many times wider than the compute dtype the activations are that `s`'s tensor-
    parallel collectives gather and its pipeline sends carry, under the executor's autocast:
    fp32 over bf16/fp16, else 1. Autocast casts only the matmuls' operands: the embedding's
    output is fp32 (fp32 weights), a bf16 branch added to it promotes, and a norm keeps its
    input's dtype (`autocast_held_bytes`), so the residual stream and the norms' outputs stay
    fp32. Sequence parallelism all-gathers a norm's output (fp32) and reduce-scatters a
    row-parallel matmul's (bf16) forward, and the reverse in backward; without it the
    forward all-reduce is the matmul's (bf16), the backward one the norm output's gradient
    (fp32). Counted with a dispatch mode on the executor's 2-rank GPT-2 TP+SP bf16 step
    (2026-11-28): 10 of 18 all-gathers and 8 of 16 reduce-scatters in fp32, the rest bf16.
    Priced where `autocast_s` is (a calibrated device, a traced profile)."""
    if sm.train.precision not in (Precision.BF16, Precision.FP16):
        return 1.0
    if not autocasts(s) or not autocast_memory(s, sm):
        return 1.0
    return FP32_BYTES / sm.train.act_bytes


NORMS_PER_BLOCK = 2
"""Norms of a pre-norm transformer block (GPT-2, Llama, Mixtral: before attention and before
the MLP), each keeping its residual-stream input for backward."""


def autocast_memory(s: Strategy, sm: StageModel) -> bool:
    """Whether `autocast_held_bytes` may be more than 0 for `s`, whatever its ZeRO stage or
    offload (the search then prices its memory choice by choice)."""
    first = sm.profile.layers[0]
    if sm.op_by_op_kernels(first) is None or sm.train.precision == Precision.FP32:
        return False
    return _autocast_shape(s)


def autocast_held_bytes(
    s: Strategy, stage: Stage, sm: StageModel, inflight: float, policy: Policy
) -> float:
    """Bytes autocast over fp32 weights holds at the stage's peak beyond what a profile traced
    in the compute dtype keeps (priced where `autocast_s` is). Measured with the torch
    profiler's memory events on the executor's gpt-small bf16 step (2 gloo ranks, 2026-11-26):
    the blocks held 172 MB under DDP and 184 MB under TP+SP against 132 MB traced in bf16.

    - the matmuls save the bf16 copies autocast casts their fp32 weights to, one set per
      micro-batch in flight, for every block not fully recomputed (a recomputed block casts
      again inside its region) and the head's projection;
    - the residual stream stays fp32 (the embedding's output is fp32, and a bf16 branch added
      to it promotes), so what a norm keeps of it is fp32, and so is a fully recomputed
      block's kept input; a norm's fp32 output is cast by each matmul reading it, each copy
      kept. A traced profile carries each layer's saved bytes under autocast
      (`LayerCost.autocast_saved_bytes`, `profiler/autocast_trace.py`: GPT-2 2, Llama 5
      residual-sized bf16 tensors' bytes more per block); without it each norm's kept input
      (two per block, `NORMS_PER_BLOCK`, and the final norm's) counts twice.
    `tests/test_autocast_memory.py` checks it against the saved tensors of GPT-2 and Llama."""
    if not autocasts(s) or not autocast_memory(s, sm):
        return 0.0
    per_mb = autocast_extra_bytes(s, stage.layers, sm.profile, sm.act_scale, policy)
    return inflight * per_mb + cached_weight_bytes(s, stage.layers, sm.profile, sm.act_scale)


def weights_cached(s: Strategy) -> bool:
    """Whether autocast's cache holds the weights' casts through the step: a pipeline's whole
    `schedule.step` runs in one autocast context (`autocast_s`), so its micro-batches share one
    bf16 copy of each weight, held until the step ends, recomputed blocks' too."""
    return s.pp > 1


def cached_weight_bytes(
    s: Strategy, layers: Sequence[int], p: ModelProfile, act_scale: float
) -> float:
    """The cached bf16 weight copies of the chain `layers` (a stage's) when `weights_cached`
    (its blocks' and its head's matmul weights, once), else 0 (then `autocast_layer_bytes`
    counts them per micro-batch in flight)."""
    if not weights_cached(s):
        return 0.0
    compute_bytes = p.act_dtype_bytes * act_scale
    total = 0.0
    for i in layers:
        x = p.layers[i]
        if x.kind == LayerKind.BLOCK:
            total += (x.params / s.tp + x.expert_params / (s.tp * s.ep_dp)) * compute_bytes
        elif x.kind == LayerKind.HEAD:
            total += p.vocab * p.hidden / s.tp * compute_bytes
    return total


def autocast_extra_bytes(
    s: Strategy, layers: Sequence[int], p: ModelProfile, act_scale: float, policy: Policy
) -> float:
    """`autocast_held_bytes` of one micro-batch of `s` over the chain `layers` of `p` (traced
    in the compute dtype, `act_scale` to the training one), whatever the device."""
    mbs = s.micro_batch_size
    total = 0.0
    for i in layers:
        rc = policy if isinstance(policy, Recompute) else policy[i]
        total += mbs * autocast_layer_bytes(
            p,
            p.layers[i],
            act_scale,
            rc,
            tp=s.tp,
            sp=s.sequence_parallel,
            cp=s.cp,
            ep=s.ep_dp,
            mbs=mbs,
            cached=weights_cached(s),
        )
    return total


def autocast_layer_bytes(
    p: ModelProfile,
    x: LayerCost,
    act_scale: float,
    rc: Recompute,
    *,
    tp: int,
    sp: bool,
    cp: int,
    ep: int,
    mbs: int,
    cached: bool = False,
) -> float:
    """One layer's share of `autocast_extra_bytes`, per sequence of a micro-batch of `mbs`
    (the weight copies spread over its sequences, unless `cached`: `cached_weight_bytes`
    holds them once): what the recompute solver adds to a layer's kept bytes under policy
    `rc` (`per_layer.py`)."""
    compute_bytes = p.act_dtype_bytes * act_scale
    widen = act_scale * (FP32_BYTES / compute_bytes - 1)  # traced bytes -> the extra
    shard = (tp if sp else 1) * cp
    if x.kind == LayerKind.BLOCK and rc == Recompute.FULL:
        return x.input_bytes * widen / shard
    if x.kind not in (LayerKind.BLOCK, LayerKind.HEAD):
        return 0.0
    if x.autocast_saved_bytes is not None:  # traced under autocast (`autocast_trace.py`)
        kept = (x.act_tp_bytes + x.act_replicated_bytes) * act_scale
        extra = max(0.0, x.autocast_saved_bytes - kept)
    else:  # the pre-norm rule: each norm's kept input widens (the head: the final norm's)
        extra = (NORMS_PER_BLOCK if x.kind == LayerKind.BLOCK else 1) * x.input_bytes * widen
    if cached:
        return extra / shard
    if x.kind == LayerKind.BLOCK:
        weights = (x.params / tp + x.expert_params / (tp * ep)) * compute_bytes
        return weights / mbs + extra / shard
    return p.vocab * p.hidden / tp * compute_bytes / mbs + extra / shard  # the head's copy
