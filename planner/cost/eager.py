"""A traced layer on a measured machine, operator by operator.

On a device `paraplan calibrate` measured, a layer traced from the real model is priced from
what its trace saw (`LayerCost.fwd_ops`, `fwd_stream_bytes`, `fwd_special`, and the same in
backward) rather than from a generic transformer block:

- every dispatched aten operator pays the measured per-operator cost (`launch_s`): on a CPU the
  Python, dispatcher and autograd bookkeeping, which dominates small models;
- memory-bound operators stream the bytes the trace counted, at the bandwidth measured for
  tensors of the layer's activation size (small activations stay in the caches);
- transcendental operators (tanh, exp, erf, softmax, ...) run at their measured element rate:
  a CPU evaluates tanh several times slower than it streams memory, and an eager model may
  spell an activation as many operators (Hugging Face's GPT-2 `gelu_new` is eight);
- GEMMs and attention keep their measured curves (`calibrated.py`).

The unfused optimizer the executor runs on a CPU (torch.optim.AdamW's single-tensor loop,
torch's default off CUDA) is priced the same way: operators per parameter tensor, and the
passes over the states they stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..calibration_tp import TensorParallelDispatch
from ..config import TrainConfig
from ..model import LayerCost, LayerKind, ModelProfile
from .calibrated import CalibratedKernels
from .compute import is_math_attention, layer_gemms

ADAMW_OPS_PER_TENSOR = 10
"""Aten operators of one parameter's update in torch.optim.adamw's `_single_tensor_adam`
(torch 2.13): step += 1, step.item(), param.mul_ (weight decay), exp_avg.lerp_,
exp_avg_sq.mul_ and .addcmul_, sqrt, div, add_ (eps) and param.addcdiv_ (counted by a
TorchDispatchMode over `optimizer.step()`: 522 operators for GPT-2 tiny's 52 tensors)."""
ADAMW_STREAMED_VALUES = 21
"""Parameter-sized values those operators read and write per parameter: mul_ 2, lerp_ 3,
mul_ 2, addcmul_ 4, sqrt 2, div 2, add_ 2, addcdiv_ 4."""

LOSS_BYTES = 4.0
"""Bytes per logit of the loss's memory-bound work: the loss runs in fp32 whatever the
compute precision (Hugging Face's `ForCausalLMLoss` upcasts with `logits.float()`, torchtitan's
`cross_entropy_loss` with `.float()`), so a head's log-softmax, its backward and the zeroed
gradient stream fp32 tensors of tokens x vocabulary (per TP rank under a vocabulary-parallel
loss); their size sets the bandwidth (`CalibratedKernels.stream_s`), past the allocator's mmap
threshold with page faults (`profiler/microbench_stream.py`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LogitsPasses:
    """Work over a rank's fp32 logits, in passes of the whole tensor."""

    streamed: int
    """Tensors read or written by memory-bound operators."""
    fresh: int
    """Of those written, outputs freshly allocated (page faults past the mmap threshold)."""
    exp: int
    """Passes of `exp` (a transcendental, at its measured rate)."""


LOSS_PARALLEL_FWD = LogitsPasses(streamed=6, fresh=2, exp=1)
"""What torch's `loss_parallel` (torch/distributed/tensor/parallel/loss.py, torch 2.13), which
the executor runs on vocabulary-sharded logits when tp > 1, adds to the forward over the fused
log-softmax the trace saw: amax (1 read), x - max (read, fresh write), exp (its own pass), sum
(1 read), shifted - logsumexp (read, fresh write)."""
LOSS_PARALLEL_BWD = LogitsPasses(streamed=5, fresh=2, exp=1)
"""Its backward over log-softmax's: exp(x) again, (grad + exp) (2 reads, fresh write) and the
product with the output gradient (read, fresh write). Measured on 2 gloo ranks over 2048 x
4096 fp32 logits per rank (2026-11-25): 160 ms forward+backward against 73 ms for the plain
loss on the same shard; these passes price 75 ms of the 87. The rest: its DTensor handlers'
host work (`TensorParallelDispatch.loss_fwd_s`, measured by `paraplan calibrate` since
2026-11-29) and waiting on its three forward all-reduces (`stage_core.LOSS_ALL_REDUCES`)."""


def loss_parallel_extra_s(k: CalibratedKernels, passes: LogitsPasses, logits_bytes: float) -> float:
    """Seconds `passes` over fp32 logits of `logits_bytes` per rank take on `k`."""
    elems = logits_bytes / LOSS_BYTES
    return (
        k.stream_s(passes.streamed * logits_bytes, logits_bytes)
        + k.fresh_output_s(passes.fresh * logits_bytes, logits_bytes)
        + k.special_s("aten.exp", passes.exp * elems, LOSS_BYTES, logits_bytes)
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class EagerExtra:
    """One micro-batch's non-GEMM, non-attention work in a traced layer, as the host's
    operator dispatch and the device's kernels (`CalibratedKernels.host_and_device_s` joins
    them: added on a CPU, overlapped on a GPU)."""

    fwd_host_s: float
    fwd_device_s: float
    bwd_host_s: float
    bwd_device_s: float


def eager_extra_s(
    x: LayerCost,
    k: CalibratedKernels,
    *,
    share: float,
    mbs: int,
    act_scale: float,
    elem_bytes: float,
    tensor_bytes: float,
) -> EagerExtra:
    """One micro-batch's non-GEMM, non-attention work in a traced layer: operator dispatch
    (host), and memory-bound traffic, the first touch of fresh outputs past the allocator's
    mmap threshold and transcendentals (device). `share` is the part of the layer's
    activations one rank holds (1 / (tp * cp)); `tensor_bytes` the size of one activation on
    the rank (what sets the streaming bandwidth)."""
    seqs = mbs * share
    out = []
    for ops, stream, written, special in (
        (x.fwd_ops, x.fwd_stream_bytes, x.fwd_written_bytes, x.fwd_special),
        (x.bwd_ops, x.bwd_stream_bytes, x.bwd_written_bytes, x.bwd_special),
    ):
        t = k.stream_s(stream * seqs * act_scale, tensor_bytes)
        t += k.fresh_output_s(written * seqs * act_scale, tensor_bytes)
        for o in special:
            t += k.special_s(o.op, o.elems * seqs, elem_bytes, tensor_bytes)
        out += [k.launch_s * ops, t]
    return EagerExtra(
        fwd_host_s=out[0], fwd_device_s=out[1], bwd_host_s=out[2], bwd_device_s=out[3]
    )


def unfused_adamw_s(
    params: float,
    tensors: int,
    k: CalibratedKernels,
    *,
    state_bytes: float,
    dtensor_tensor_s: float = 0.0,
) -> float:
    """Seconds of torch's single-tensor AdamW over `params` parameters in `tensors` tensors
    (the rank's shard): the operators' dispatch plus the passes they stream, each value
    `state_bytes` wide (fp32 master and states), plus `dtensor_tensor_s` per tensor when the
    parameters are DTensors (`Calibration.dtensor_adamw_tensor_s`: every operator of the update
    runs DTensor's dispatch first; ~130 us per tensor here, so AdamW took 11.8 ms of a 2-rank
    FSDP2 GPT-2 tiny step in the profiler, 2026-11-25)."""
    per_tensor_bytes = params * state_bytes / max(1, tensors)
    streamed = ADAMW_STREAMED_VALUES * params * state_bytes
    dispatch_s = (k.dispatch_s * ADAMW_OPS_PER_TENSOR + dtensor_tensor_s) * tensors
    return k.host_and_device_s(dispatch_s, k.stream_s(streamed, per_tensor_bytes))


def traced_layer_s(
    k: CalibratedKernels,
    p: ModelProfile,
    train: TrainConfig,
    act_scale: float,
    x: LayerCost,
    tp: int,
    cp: int,
    mbs: int,
    gemm_s: tuple[float, float],
    tp_dispatch: TensorParallelDispatch | None = None,
) -> tuple[float, float, float, float, float]:
    """`stages.StageModel._one_layer` of a traced layer on a calibrated device: the GEMMs priced by
    the caller (`gemm_s`: forward, backward), attention from its curve (or the score GEMMs
    when unfused), and every other operator as traced (`eager_extra_s`)."""
    block = x.kind == LayerKind.BLOCK
    attn_f = attn_b = 0.0
    if block and is_math_attention(p, x):
        m = max(1, mbs * p.heads // tp) * (p.seq_len // cp)
        qk = k.gemm_train_s(m, p.seq_len, p.head_size)
        av = k.gemm_train_s(m, p.head_size, p.seq_len)
        attn_f, attn_b = qk[0] + av[0], qk[1] + av[1]
    elif block:
        attn_f, attn_b = k.attention_s(
            x.attn_core_fwd_flops * mbs / (tp * cp), head_dim=p.head_size, seq_len=p.seq_len // cp
        )
    act_bytes = float(train.act_bytes)
    tokens = mbs * p.seq_len / cp
    if x.kind == LayerKind.HEAD:  # its memory-bound work is on the rank's logits, in fp32
        elem_bytes, tensor_bytes = LOSS_BYTES, tokens * p.vocab / tp * LOSS_BYTES
    else:
        elem_bytes, tensor_bytes = act_bytes, tokens * p.hidden * act_bytes
    extra = eager_extra_s(
        x,
        k,
        share=1.0 / (tp * cp),
        mbs=mbs,
        act_scale=act_scale,
        elem_bytes=elem_bytes,
        tensor_bytes=tensor_bytes,
    )
    dt_f, dt_b = tensor_parallel_host_s(k, p, x, tp, tp_dispatch)
    loss_f = loss_b = 0.0
    if x.kind == LayerKind.HEAD and tp > 1:  # the executor's vocabulary-parallel loss
        loss_f = loss_parallel_extra_s(k, LOSS_PARALLEL_FWD, tensor_bytes)
        loss_b = loss_parallel_extra_s(k, LOSS_PARALLEL_BWD, tensor_bytes)
        if tp_dispatch is not None:  # and its DTensor handlers' host work, measured
            dt_f += tp_dispatch.loss_fwd_s * k.time_scale
            dt_b += tp_dispatch.loss_bwd_s * k.time_scale
    f = k.host_and_device_s(
        extra.fwd_host_s + dt_f, gemm_s[0] + attn_f + extra.fwd_device_s + loss_f
    )
    b = k.host_and_device_s(
        extra.bwd_host_s + dt_b, gemm_s[1] + attn_b + extra.bwd_device_s + loss_b
    )
    # a fully recomputed block re-runs its forward inside one checkpoint region, whose own
    # host work the calibration measured: the region's entry and exit, and the saved-tensor
    # hooks on each tensor the forward saves (`profiler/microbench_checkpoint.py`)
    region_s = k.fit.checkpoint_region_s + k.fit.checkpoint_saved_tensor_s * x.saved_tensors
    full = f + region_s * k.time_scale if block else 0.0
    return f, b, full, attn_f, attn_f


def tensor_parallel_host_s(
    k: CalibratedKernels,
    p: ModelProfile,
    x: LayerCost,
    tp: int,
    td: TensorParallelDispatch | None,
    sequence_parallel: bool = True,
) -> tuple[float, float]:
    """(forward, backward) host seconds DTensor adds to a block under tensor parallelism:
    what `paraplan calibrate` measured on the executor's own block of the same kind (a gated
    MLP or not; with or without sequence parallelism), wrapped less unwrapped
    (`calibration_tp`). The host work does not grow with the block's width (DTensor's sharding
    propagation and redistribution logic run once per operator, whatever its size)."""
    if tp == 1 or td is None or x.kind != LayerKind.BLOCK:
        return 0.0, 0.0
    gemms = layer_gemms(p, x, tp)
    gated = gemms is not None and len(gemms) == 4 and gemms[2].n * tp == 2 * p.ffn
    f, b = td.block_s(gated=gated, sequence_parallel=sequence_parallel)
    return f * k.time_scale, b * k.time_scale
