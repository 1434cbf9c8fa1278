"""The kernel models a step is priced with: the measured or the catalog's one in the compute
dtype (`kernels_for`), and under fp8 training the blocks' linear layers in fp8
(`float8_linears`).

fp8 training (`Precision.FP8`): the linear layers of every transformer block run their three
GEMMs (forward, input gradient, weight gradient) in fp8 with dynamic tensorwise scaling, as
torchao's `Float8Linear` does under torchtitan (`model.converters = ["float8"]`; the output
head is filtered out and stays bf16: `float8.filter_fqns = ["output"]`, 0.3's Llama 3 405B
config `["lm_head"]`) and Transformer Engine's recipes do in NeMo and Megatron-LM. Attention,
norms, the head and the collectives stay bf16; so do the activations kept for backward
(torchao's `matmul_with_hp_or_float8_args` saves the bf16 input and weight and casts them
again in backward), so memory is bf16's.

Two mechanisms, nothing fitted:
- Each GEMM runs through the same tile model as bf16 (`compute.KernelModel`) at the
  accelerator's fp8 dense peak, its operands streaming one byte per element in the roofline
  term. Assumption: cuBLASLt's fp8 GEMMs reach the same fraction of their peak as its bf16
  ones (the tiles are the same; Hopper's fp8 tensor cores double the rate per SM).
- Dynamic scaling makes every fp8 operand from a bf16 tensor: an absolute-max reduction, then a
  scaled, saturated cast. Compiled (torch.compile, or Transformer Engine's fused casts), that
  is two memory-bound passes: the reduction reads the tensor, the cast reads it again and
  writes one byte per element (`CAST_BYTES`). fp8 is run compiled whatever the rest of the
  step does (torchao's float8 README: its casts are meant to be fused by torch.compile; eager,
  its formula runs one operator at a time, `CAST_BYTES_EAGER`, slower than bf16 altogether), so
  the compiled count is priced under every runtime. Per linear layer (m tokens, k inputs,
  n outputs) and step: forward casts the input (m k) and the weight (k n); backward casts the
  output gradient (m n), the saved weight and input again, and lays the output gradient out a
  second time for the weight-gradient GEMM (fp8 GEMMs on Hopper take only the "TN" layout,
  cuBLASLt's `cublasLtMatmul` fp8 requirements), a cast without the reduction
  (`RELAYOUT_BYTES`). That is torchao's `Float8Linear` (`Float8Casts.TORCHAO`: it saves the
  bf16 input and weight and casts them again in backward).
- Transformer Engine under Megatron-Core (`Float8Casts.TRANSFORMER_ENGINE`: NeMo, Megatron-LM)
  casts each operand once, in both layouts by one kernel (`fp8_cast_transpose_fused`,
  transformer_engine/pytorch/module/linear.py), with current (tensorwise) scaling after an
  absolute-max pass (`TE_CAST_BYTES`): per micro-batch the input in forward, saved in fp8 for
  the weight-gradient GEMM, and the output gradient in backward; the weight once per step, on
  the first micro-batch, whose fp8 copies the later ones reuse (`is_first_microbatch`, set by
  Megatron-Core's schedules through `set_is_first_microbatch`): `weight_cast_s`, a
  once-per-step term of the stage. Those copies stay on the GPU (`te_weight_copy_bytes`, 2
  bytes per weight element) unless the weights are fp8 parameters themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster import Cluster
from ..config import AttentionKernel, Float8Casts, Precision, Runtime, TrainConfig
from ..model import LayerCost, LayerKind, ModelProfile
from ..strategy import Recompute
from .compute import KERNELS, KernelModel, Kernels, layer_gemms
from .layout import Stage
from .memory import layer_act_bytes

CAST_BYTES = 5
"""Bytes per element of one compiled dynamic cast of a bf16 tensor to fp8: the absolute-max
reduction reads 2, the cast reads 2 and writes 1 (two kernels: the scale needs the whole
reduction before any element is cast)."""
CAST_BYTES_EAGER = 33
"""The same in eager PyTorch, torchao's `hp_tensor_to_float8_dynamic` one operator at a time:
abs (reads 2, writes 2), max (reads 2), to fp32 (reads 2, writes 4), multiply by the scale
(reads 4, writes 4), clamp to the fp8 range (reads 4, writes 4), to fp8 (reads 4, writes 1).
Not priced: it is why fp8 is run compiled."""
RELAYOUT_BYTES = 3
"""A second fp8 layout of a tensor whose scale is known, compiled: reads 2, writes 1."""
TE_CAST_BYTES = 6
"""Bytes per element of Transformer Engine's current-scaling cast of a bf16 tensor to fp8 in
both layouts: the absolute-max pass reads 2, the fused cast-transpose reads 2 and writes 1 in
each layout."""


@dataclass(frozen=True, slots=True)
class Float8Linears:
    """Prices a block's linear layers in fp8: GEMMs at the fp8 rate and the casts' traffic."""

    fp8: KernelModel
    """The catalog's tile model at the fp8 peak."""
    bf16: KernelModel
    """The same at the bf16 peak: a measured (calibrated) bf16 GEMM is scaled by fp8's gain."""
    casts: Float8Casts = Float8Casts.TORCHAO
    """How the framework makes the fp8 operands (`Float8Casts`)."""

    def gemm_train_s(self, k: Kernels, m: int, n: int, kk: int) -> tuple[float, float]:
        """(forward, backward) seconds of a linear layer (m x kk) @ (kk x n) in fp8 training,
        casts included; `k` prices the step's bf16 kernels (the catalog's or measured ones)."""
        f8, b8 = self.fp8.gemm_train_s(m, n, kk)
        if k is not self.bf16:  # measured bf16 GEMMs: fp8 gains what the tile model says
            f16, b16 = k.gemm_train_s(m, n, kk)
            c16f, c16b = self.bf16.gemm_train_s(m, n, kk)
            f8, b8 = f16 * f8 / c16f, b16 * b8 / c16b
        if self.casts == Float8Casts.TRANSFORMER_ENGINE:  # weights: `weight_cast_s`
            return f8 + k.elementwise_s(TE_CAST_BYTES * m * kk), b8 + k.elementwise_s(
                TE_CAST_BYTES * m * n
            )
        c = CAST_BYTES
        fwd_bytes = c * (m * kk + kk * n)
        bwd_bytes = (c + RELAYOUT_BYTES) * m * n + c * (m * kk + kk * n)
        return f8 + k.elementwise_s(fwd_bytes), b8 + k.elementwise_s(bwd_bytes)

    def weight_cast_s(self, k: Kernels, weight_elements: float) -> float:
        """Seconds per step a stage spends casting the `weight_elements` weights of its blocks'
        linear layers (one rank's) to fp8 once per step (Transformer Engine's cached fp8 weights);
        0 where every micro-batch casts them (`gemm_train_s` prices those)."""
        if self.casts != Float8Casts.TRANSFORMER_ENGINE:
            return 0.0
        return k.elementwise_s(TE_CAST_BYTES * weight_elements)


def layer_kept_bytes(
    f8: Float8Linears | None,
    profile: ModelProfile,
    layer: LayerCost,
    *,
    tp: int,
    sp: bool,
    cp: int,
    recompute: Recompute,
    runtime: Runtime,
) -> float:
    """`memory.layer_act_bytes` in the framework's `runtime` (what its kernels keep) under the
    step's fp8 pricing `f8`: less what Transformer Engine keeps in fp8 (`fp8_kept_cut_bytes`)
    for every policy that keeps the linears' inputs (not full recompute)."""
    kept = layer_act_bytes(
        layer,
        tp=tp,
        sp=sp,
        cp=cp,
        recompute=recompute,
        saves_gathered=runtime.sp_saves_gathered_input,
        fused_norms=runtime.norm_keeps_input_only,
        fused_glu=runtime.glu_keeps_input_only,
    )
    if recompute == Recompute.FULL:
        return kept
    return kept - fp8_kept_cut_bytes(f8, profile, layer, tp, sp, cp)


def fp8_kept_cut_bytes(
    f8: Float8Linears | None, profile: ModelProfile, layer: LayerCost, tp: int, sp: bool, cp: int
) -> float:
    """Bytes per sequence (the profile's activation dtype) a block keeps less for backward when
    Transformer Engine saves its linear layers' inputs in fp8, one byte an element instead of
    two (`Float8Casts.TRANSFORMER_ENGINE`): the QKV and MLP inputs (sequence shards under
    sequence parallelism, cast before the all-gather), the attention output and the MLP's
    activation output (TP shards; each routed copy for experts). 0 under torchao (it saves
    bf16), outside fp8 and for layers not of the standard block shape (`layer_kept_bytes`
    takes it off)."""
    if f8 is None or f8.casts != Float8Casts.TRANSFORMER_ENGINE or layer.kind != LayerKind.BLOCK:
        return 0.0
    gemms = layer_gemms(profile, layer, 1)
    if gemms is None:
        return 0.0
    qkv, proj, up, down = gemms
    replicated = qkv.k * qkv.per_token + up.k * up.per_token
    sharded = proj.k * proj.per_token + down.k * down.per_token
    elements = profile.seq_len * (replicated / (tp if sp else 1) + sharded / tp) / cp
    return elements * profile.act_dtype_bytes / 2  # half of each 2-byte element


TE_WEIGHT_COPY_BYTES = 2
"""Bytes per weight element of the fp8 copy Transformer Engine keeps of a bf16 weight from one
step to the next: one byte in each GEMM layout (row-wise for the forward, the transpose for
the input gradient on Hopper's "TN"-only fp8 GEMMs)."""


def te_weight_copy_bytes(
    f8: Float8Linears | None,
    runtime: Runtime,
    profile: ModelProfile,
    stage: Stage,
    tp: int,
    ep: int,
) -> float:
    """Bytes a stage's rank holds in Transformer Engine's cached fp8 weights: every linear layer
    of its blocks keeps the fp8 copy its first micro-batch made (`TE_WEIGHT_COPY_BYTES` per
    element) in its `_fp8_workspaces`, through the step and to the next (TE's `Linear.forward`
    caches it whenever `is_first_microbatch` is given, as Megatron-Core gives it unless
    `--disable-parameter-transpose-cache`; GroupedLinear the same per expert): the copies
    `weight_cast_s` prices the cast of. None with fp8 primary weights (`Runtime.fp8_all_gather`:
    Megatron-LM's `--fp8-param-gather` sets `TransformerConfig.fp8_param`, training's
    argument_utils.py): the parameter is then the fp8 tensor, both layouts in the bytes a bf16
    parameter takes (`quantize_weight` returns it, no workspace); nor under torchao, whose
    casts live only as long as a GEMM's operands."""
    if f8 is None or f8.casts != Float8Casts.TRANSFORMER_ENGINE or runtime.fp8_all_gather:
        return 0.0
    return TE_WEIGHT_COPY_BYTES * block_weight_elements(profile, stage, tp, ep)


def block_weight_elements(profile: ModelProfile, stage: Stage, tp: int, ep: int) -> float:
    """Weights of `stage`'s transformer blocks one rank holds (TP shards them, EP the experts):
    what a once-per-step fp8 cast of its linear layers reads (norms included: a few per
    block, against millions)."""
    layers = profile.layers
    return sum(
        layers[i].params / tp + layers[i].expert_params / (tp * ep)
        for i in stage.layers
        if layers[i].kind == LayerKind.BLOCK
    )


def kernels_for(cluster: Cluster, train: TrainConfig) -> Kernels | None:
    """The measured kernel model when the cluster carries a calibration, else the catalog's
    table for the accelerator, else None (the roofline with the catalog's efficiency)."""
    calibration = cluster.calibration
    if calibration is not None:
        return calibration.kernels(train.compute_dtype)
    table = KERNELS.get(cluster.accelerator.name)
    if table is None:
        return None
    fused = train.runtime.attention == AttentionKernel.FUSED
    return KernelModel(cluster.accelerator, train.compute_dtype, table, fused_attention=fused)


def fp8_problem(cluster: Cluster) -> str | None:
    """Why `cluster` cannot price fp8 training, with the fix; None when it can."""
    acc = cluster.accelerator
    if "fp8" not in acc.peak_flops:
        have = ", ".join(acc.peak_flops)
        return (
            f"precision fp8 needs fp8 tensor cores; {acc.name} has none in the catalog (its "
            f"peak FLOP/s figures: {have}); use --precision bf16, or a cluster of h100, h200, "
            "b200, gb200, l4 or mi300x"
        )
    if acc.name not in KERNELS:
        return (
            f"precision fp8 is priced GEMM by GEMM from the accelerator's kernel table, and "
            f"{acc.name} has none; use --precision bf16"
        )
    return None


def float8_linears(
    cluster: Cluster, train: TrainConfig, bf16: Kernels | None
) -> Float8Linears | None:
    """The fp8 pricing of a block's linear layers under `train`, None unless fp8 (ValueError
    when the cluster cannot run it: `fp8_problem`). `bf16` is the step's bf16 kernel model."""
    if train.precision != Precision.FP8:
        return None
    problem = fp8_problem(cluster)
    if problem is not None:
        raise ValueError(problem)
    acc = cluster.accelerator
    table = KERNELS[acc.name]
    catalog = bf16 if isinstance(bf16, KernelModel) else KernelModel(acc, "bf16", table)
    return Float8Linears(
        fp8=KernelModel(acc, "fp8", table), bf16=catalog, casts=train.runtime.fp8_casts
    )
