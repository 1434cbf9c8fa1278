"""What `Recompute.SELECTIVE` keeps and recomputes in a block, by framework (`Runtime.selective`):

- Megatron-Core's module recompute (`SelectiveRecompute.ATTENTION_CORE` with
  `Runtime.recompute_modules`, its `--recompute-modules`): the attention core (Korthikanti et al.
  2022 §5, the default and paraplan's executor's), the two norms' outputs (`layernorm`:
  Megatron-Core discards each norm's output once the next module has consumed it and recomputes
  it from the kept norm input before that module's backward, `CheckpointWithoutOutput`), the
  routed experts' activation output (`moe_act`: the down projection's input, recomputed from the
  kept up projection output), latent attention's up projections (`mla_up_proj`), the dense MLP
  (`mlp`), the whole MoE layer (`moe`: router, dispatch, routed and shared experts, combine) and
  the shared experts (`shared_experts`), the last four by their GEMMs (`Redone`);
- torchtitan's per-operator selective checkpointing (`SelectiveRecompute.EVERY_OTHER_MATMUL`).

A recomputed norm or activation is memory-bound: it streams its input and writes its output
(the norm: h elements each way per token; SwiGLU reads its two ffn-wide halves and writes one,
GELU one and one). Bytes are per sequence in the profile's activation dtype, seconds per
micro-batch on one rank, as `stages.py` prices the rest of a block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import RecomputeModule, Runtime, SelectiveRecompute
from ..model import LayerCost, LayerKind, ModelProfile
from .compute import Gemm, Kernels, every_other_matmul, layer_gemms

NORMS_PER_BLOCK = 2
"""Norms in a pre-norm transformer block: before attention and before the MLP."""


def is_default(runtime: Runtime) -> bool:
    """Whether selective recompute is the attention core alone (Korthikanti's, the executor's)."""
    return runtime.selective == SelectiveRecompute.ATTENTION_CORE and runtime.recompute_modules == (
        RecomputeModule.CORE_ATTN,
    )


def _moe_act_elements(profile: ModelProfile, layer: LayerCost, tp: int) -> tuple[float, float]:
    """(saved, streamed) elements per token of a MoE block's expert activation on one rank: its
    output (the down projection's input, each routed copy) and what recomputing it reads and
    writes; (0, 0) for a dense block or one not of the standard shape."""
    gemms = layer_gemms(profile, layer, tp) if layer.expert_params else None
    if gemms is None:
        return 0.0, 0.0
    up, down = gemms[2], gemms[3]
    saved = down.k * down.per_token
    return saved, saved + up.n * up.per_token  # writes the output, reads the up projection's


@dataclass(frozen=True, slots=True)
class Redone:
    """What recomputing one module of a block redoes and frees, per token on one rank."""

    gemms: tuple[Gemm, ...] = ()
    """Its forward GEMMs (`per_token`: routed copies run each token's GEMM top_k times)."""
    freed: float = 0.0
    """Elements per token it no longer keeps for backward."""
    streamed: float = 0.0
    """Elements per token its memory-bound kernels read and write when redone."""


def _mla_up(profile: ModelProfile, tp: int) -> Redone:
    """Multi-head latent attention's up projections on one rank, as Megatron-Core's
    `qkv_up_proj_and_rope_apply` runs them (`--recompute-modules mla_up_proj`): their (n, k)
    GEMM shapes per token (the query's from its compressed latent, or from the hidden state
    without `q_lora_rank`; the keys' and values' from theirs), the elements per token the core
    keeps of their outputs (query and key `head_size` wide, value `v_head_dim`), and those the
    rotary embedding and the copies stream; none without latent attention."""
    lat = profile.latent_attention
    if lat is None:
        return Redone()
    heads = profile.heads // tp
    qd, nope = profile.head_size, profile.head_size - lat.qk_rope_head_dim
    gemms = (
        Gemm(n=heads * qd, k=lat.q_lora_rank or profile.hidden, per_token=1.0),
        Gemm(n=heads * (nope + lat.v_head_dim), k=lat.kv_lora_rank, per_token=1.0),
    )
    kept = heads * (2 * qd + lat.v_head_dim)
    return Redone(gemms, float(kept), 2.0 * kept)  # the outputs read and written once more


def _dense_mlp(profile: ModelProfile, layer: LayerCost, tp: int, sp: bool) -> Redone:
    """A block's dense MLP on one rank (`--recompute-modules mlp`; none in a block with
    experts): its (n, k) GEMM shapes per token, the elements per token it keeps beyond its
    input (the normalized input the first projection reads, a sequence shard under SP; the
    projection's output; the down projection's input) and what its activation streams."""
    if layer.expert_params or layer.kind != LayerKind.BLOCK:
        return Redone()
    f = (profile.dense_ffn or profile.ffn) // tp
    h = profile.hidden
    up = 2 * f if profile.gated_mlp else f
    kept = h / (tp if sp else 1) + up + f
    return Redone((Gemm(n=up, k=h, per_token=1.0), Gemm(n=h, k=f, per_token=1.0)), kept, up + f)


def _expert_mlp(ffn: int, copies: float, gated: bool, fused_glu: bool) -> tuple[float, float]:
    """(kept, streamed) elements per token of an expert MLP of inner size `ffn` (one rank's
    share) run `copies` times per token: what it keeps beyond its input (`model_spec`'s count:
    gated, the gate and up halves, silu(gate) unless the SwiGLU is fused, and the down
    projection's input; plain, the activation's input and output) and what its activation
    streams when redone (SwiGLU reads two halves and writes one, GELU reads one, writes one)."""
    kept = (4 - int(fused_glu)) * ffn if gated else 2 * ffn
    return copies * kept, copies * (3 if gated else 2) * ffn


def _moe_layer(
    profile: ModelProfile, layer: LayerCost, tp: int, sp: bool, fused_glu: bool
) -> Redone:
    """A block's whole MoE layer on one rank (`--recompute-modules moe`; none in a block
    without experts), checkpointed from its input (the MLP norm's output, which the block keeps
    anyway): the router's GEMM and the routed and shared experts' (up and down projections,
    ffn / tp wide, each routed copy's), and what it keeps beyond its input, as `model_spec`
    counts it: the router's probabilities (one per expert), each routed copy of the token after
    dispatch and before combine (h each, a sequence shard under SP), the experts' MLPs
    (`_expert_mlp`); redoing it also streams those copies once each (the permutations). Its
    all-to-alls are priced with the stage's communication (`stage_core`)."""
    if not layer.expert_params or layer.kind != LayerKind.BLOCK:
        return Redone()
    h, k, gated = profile.hidden, float(profile.top_k), profile.gated_mlp
    f = max(1, profile.ffn // tp)
    routed_kept, routed_streamed = _expert_mlp(f, k, gated, fused_glu)
    shared = _shared_experts(profile, layer, tp, fused_glu)
    copies = (2 * k * h + profile.experts) / (tp if sp else 1)
    gemms = (
        Gemm(n=profile.experts, k=h, per_token=1.0 / (tp if sp else 1)),
        Gemm(n=(2 if gated else 1) * f, k=h, per_token=k),
        Gemm(n=h, k=f, per_token=k),
        *shared.gemms,
    )
    kept = copies + routed_kept + shared.freed
    streamed = routed_streamed + 2 * k * h / (tp if sp else 1) + shared.streamed
    return Redone(gemms, kept, streamed)


def _shared_experts(profile: ModelProfile, layer: LayerCost, tp: int, fused_glu: bool) -> Redone:
    """A block's shared experts on one rank (`--recompute-modules shared_experts`; none without
    them or in a block without experts): their up and down projections (all shared experts as
    one MLP of `shared_expert_ffn`, TP-split like the dense MLP) and what they keep beyond
    their input, the MoE layer's (`_expert_mlp`)."""
    if not layer.expert_params or layer.kind != LayerKind.BLOCK or not profile.shared_expert_ffn:
        return Redone()
    h, gated = profile.hidden, profile.gated_mlp
    f = max(1, profile.shared_expert_ffn // tp)
    kept, streamed = _expert_mlp(f, 1.0, gated, fused_glu)
    gemms = (Gemm(n=(2 if gated else 1) * f, k=h, per_token=1.0), Gemm(n=h, k=f, per_token=1.0))
    return Redone(gemms, kept, streamed)


def _modules_redone(
    modules: tuple[RecomputeModule, ...],
    profile: ModelProfile,
    layer: LayerCost,
    *,
    tp: int,
    sp: bool,
    fused_glu: bool,
) -> tuple[Redone, ...]:
    """What recomputing each of `modules` priced by its GEMMs redoes in `layer`; `moe`
    includes the shared experts (and the experts' activation, `moe_act`), not counted twice."""
    priced = {
        RecomputeModule.MLA_UP_PROJ: lambda: _mla_up(profile, tp),
        RecomputeModule.MLP: lambda: _dense_mlp(profile, layer, tp, sp),
        RecomputeModule.MOE: lambda: _moe_layer(profile, layer, tp, sp, fused_glu),
        RecomputeModule.SHARED_EXPERTS: lambda: _shared_experts(profile, layer, tp, fused_glu),
    }
    if RecomputeModule.MOE in modules:
        del priced[RecomputeModule.SHARED_EXPERTS]
    return tuple(redo() for module, redo in priced.items() if module in modules)


def modules_kept_bytes(
    profile: ModelProfile,
    layer: LayerCost,
    modules: tuple[RecomputeModule, ...],
    *,
    kept_none: float,
    kept_core: float,
    tp: int,
    sp: bool,
    cp: int,
    fused_glu: bool = False,
) -> float:
    """Bytes per sequence a block keeps when Megatron-Core recomputes `modules`: what it keeps
    without recompute (`kept_none`) less the attention core (`kept_none - kept_core`, as
    `memory.layer_act_bytes` drops it), the norms' outputs (h elements per token each, a
    sequence shard under SP), each routed copy's activation output, and what the modules priced
    by their GEMMs free (`_modules_redone`; `moe` frees the experts' activation itself)."""
    per_elem = layer.input_bytes / (profile.seq_len * profile.hidden)  # bytes per element
    kept = kept_none
    if RecomputeModule.CORE_ATTN in modules:
        kept -= kept_none - kept_core
    elements = 0.0
    if RecomputeModule.LAYERNORM in modules:
        elements += NORMS_PER_BLOCK * profile.hidden / (tp if sp else 1)
    if RecomputeModule.MOE_ACT in modules and RecomputeModule.MOE not in modules:
        elements += _moe_act_elements(profile, layer, tp)[0]
    redone = _modules_redone(modules, profile, layer, tp=tp, sp=sp, fused_glu=fused_glu)
    elements += sum(r.freed for r in redone)
    kept -= elements * profile.seq_len * per_elem / cp
    return max(kept, layer.input_bytes / ((tp if sp else 1) * cp))  # its input, at least


def modules_recompute_s(
    kernels: Kernels,
    profile: ModelProfile,
    layer: LayerCost,
    modules: tuple[RecomputeModule, ...],
    *,
    attn_f: float,
    tokens: float,
    tp: int,
    sp: bool,
    act_bytes: float,
    linear_f: Callable[[int, int, int], float],
) -> float:
    """Forward seconds Megatron-Core's module recompute redoes in one block per micro-batch
    (`tokens` on this rank): the attention core's forward (`attn_f`), the norms (read and
    write h per token each) and the experts' activation (memory-bound, `Kernels.elementwise_s`),
    latent attention's up projections, the dense MLP, the MoE layer and the shared experts
    (their GEMMs by `linear_f`, forward seconds of an (m x k) @ (k x n) GEMM, and what their
    elementwise kernels stream). The MoE layer's all-to-alls are the stage's (`stage_core`)."""
    seconds = attn_f if RecomputeModule.CORE_ATTN in modules else 0.0
    elements = 0.0
    if RecomputeModule.LAYERNORM in modules:
        elements += 2 * NORMS_PER_BLOCK * profile.hidden / (tp if sp else 1)
    if RecomputeModule.MOE_ACT in modules and RecomputeModule.MOE not in modules:
        elements += _moe_act_elements(profile, layer, tp)[1]
    for r in _modules_redone(modules, profile, layer, tp=tp, sp=sp, fused_glu=False):
        seconds += sum(linear_f(max(1, round(tokens * g.per_token)), g.n, g.k) for g in r.gemms)
        elements += r.streamed
    if elements:
        seconds += kernels.elementwise_s(elements * tokens * act_bytes)
    return seconds


def every_other_matmul_s(
    linear_s: Callable[[int, int, int], float],
    profile: ModelProfile,
    *,
    tp: int,
    gated: bool,
    tokens: float,
    elementwise_f: float,
) -> float:
    """Forward seconds torchtitan's per-op selective checkpointing redoes in one block: every
    second matmul (`compute.every_other_matmul`; `linear_s(m, n, k)` its forward) and every
    elementwise operator (`elementwise_f`); attention's output is saved."""
    again = every_other_matmul(profile, tp, gated=gated)
    return elementwise_f + sum(
        linear_s(max(1, round(tokens * g.per_token)), g.n, g.k) for g in again
    )


def every_other_matmul_kept(
    profile: ModelProfile, layer: LayerCost, tp: int, sp: bool, cp: int
) -> float:
    """Bytes per sequence a block keeps under torchtitan's per-op selective checkpointing: its
    input (the checkpoint's), the outputs of the 1st, 3rd, 5th and 7th matmuls (q, v, w1 and
    w2's partial sum; fc1 without a gated MLP) and the fused attention's output
    (`compute.every_other_matmul` for the order)."""
    p = profile
    h, q, kv = p.hidden, p.q_dim, p.kv_dim
    gated = layer.fwd_flops - layer.attn_core_fwd_flops > 2 * p.seq_len * h * (
        2 * q + 2 * kv + 2.5 * p.ffn
    )
    per_elem = layer.input_bytes / (p.seq_len * h)  # bytes per activation element
    elements = h / (tp if sp else 1) + (q + kv + p.ffn + q) / tp + (h if gated else 0)
    return elements * p.seq_len * per_elem / cp


def selective_kept_bytes(
    runtime: Runtime,
    profile: ModelProfile,
    layer: LayerCost,
    *,
    kept_none: float,
    kept_core: float,
    tp: int,
    sp: bool,
    cp: int,
) -> float:
    """Bytes per sequence a layer keeps under `Recompute.SELECTIVE` in `runtime`'s framework
    (`kept_core`: `memory.layer_act_bytes`'s, the attention core dropped)."""
    if layer.kind != LayerKind.BLOCK or is_default(runtime):
        return kept_core
    if runtime.selective == SelectiveRecompute.EVERY_OTHER_MATMUL:
        return min(kept_core, every_other_matmul_kept(profile, layer, tp, sp, cp))
    return modules_kept_bytes(
        profile, layer, runtime.recompute_modules, kept_none=kept_none, kept_core=kept_core,
        tp=tp, sp=sp, cp=cp, fused_glu=runtime.glu_keeps_input_only,
    )  # fmt: skip
