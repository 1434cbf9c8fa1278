"""What `Recompute.SELECTIVE` keeps and recomputes in a block, by framework (`Runtime.selective`):

- Megatron-Core's module recompute (`SelectiveRecompute.ATTENTION_CORE` with
  `Runtime.recompute_modules`, its `--recompute-modules`): the attention core (Korthikanti et al.
  2022 §5, the default and paraplan's executor's), the two norms' outputs (`layernorm`:
  Megatron-Core discards each norm's output once the next module has consumed it and recomputes
  it from the kept norm input before that module's backward, `CheckpointWithoutOutput`), the
  routed experts' activation output (`moe_act`: the down projection's input, recomputed from the
  kept up projection output);
- torchtitan's per-operator selective checkpointing (`SelectiveRecompute.EVERY_OTHER_MATMUL`).

A recomputed norm or activation is memory-bound: it streams its input and writes its output
(the norm: h elements each way per token; SwiGLU reads its two ffn-wide halves and writes one,
GELU one and one). Bytes are per sequence in the profile's activation dtype, seconds per
micro-batch on one rank, as `stages.py` prices the rest of a block.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import RecomputeModule, Runtime, SelectiveRecompute
from ..model import LayerCost, LayerKind, ModelProfile
from .compute import Kernels, every_other_matmul, layer_gemms

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


Shapes = tuple[tuple[int, int], ...]
"""GEMMs as (n, k) pairs per token: an (m x k) @ (k x n) product for m tokens."""


def _mla_up(profile: ModelProfile, tp: int) -> tuple[Shapes, float, float]:
    """Multi-head latent attention's up projections on one rank, as Megatron-Core's
    `qkv_up_proj_and_rope_apply` runs them (`--recompute-modules mla_up_proj`): their (n, k)
    GEMM shapes per token (the query's from its compressed latent, or from the hidden state
    without `q_lora_rank`; the keys' and values' from theirs), the elements per token the core
    keeps of their outputs (query and key `head_size` wide, value `v_head_dim`), and those the
    rotary embedding and the copies stream; none without latent attention."""
    lat = profile.latent_attention
    if lat is None:
        return (), 0.0, 0.0
    heads = profile.heads // tp
    qd, nope = profile.head_size, profile.head_size - lat.qk_rope_head_dim
    gemms = (
        (heads * qd, lat.q_lora_rank or profile.hidden),
        (heads * (nope + lat.v_head_dim), lat.kv_lora_rank),
    )
    kept = heads * (2 * qd + lat.v_head_dim)
    return gemms, float(kept), 2.0 * kept  # the outputs read and written once more


def _dense_mlp(
    profile: ModelProfile, layer: LayerCost, tp: int, sp: bool
) -> tuple[Shapes, float, float]:
    """A block's dense MLP on one rank (`--recompute-modules mlp`; none in a block with
    experts): its (n, k) GEMM shapes per token, the elements per token it keeps beyond its
    input (the normalized input the first projection reads, a sequence shard under SP; the
    projection's output; the down projection's input) and what its activation streams."""
    if layer.expert_params or layer.kind != LayerKind.BLOCK:
        return (), 0.0, 0.0
    f = (profile.dense_ffn or profile.ffn) // tp
    h = profile.hidden
    up = 2 * f if profile.gated_mlp else f
    kept = h / (tp if sp else 1) + up + f
    return ((up, h), (h, f)), kept, float(up + f)


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
) -> float:
    """Bytes per sequence a block keeps when Megatron-Core recomputes `modules`: what it keeps
    without recompute (`kept_none`) less the attention core (`kept_none - kept_core`, as
    `memory.layer_act_bytes` drops it), the norms' outputs (h elements per token each, a
    sequence shard under SP) and each routed copy's activation output."""
    per_elem = layer.input_bytes / (profile.seq_len * profile.hidden)  # bytes per element
    kept = kept_none
    if RecomputeModule.CORE_ATTN in modules:
        kept -= kept_none - kept_core
    elements = 0.0
    if RecomputeModule.LAYERNORM in modules:
        elements += NORMS_PER_BLOCK * profile.hidden / (tp if sp else 1)
    if RecomputeModule.MOE_ACT in modules:
        elements += _moe_act_elements(profile, layer, tp)[0]
    if RecomputeModule.MLA_UP_PROJ in modules:
        elements += _mla_up(profile, tp)[1]
    if RecomputeModule.MLP in modules:
        elements += _dense_mlp(profile, layer, tp, sp)[1]
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
    latent attention's up projections and the dense MLP (their GEMMs by `linear_f`, forward
    seconds of an (m x k) @ (k x n) GEMM, and what their elementwise kernels stream)."""
    seconds = attn_f if RecomputeModule.CORE_ATTN in modules else 0.0
    elements = 0.0
    if RecomputeModule.LAYERNORM in modules:
        elements += 2 * NORMS_PER_BLOCK * profile.hidden / (tp if sp else 1)
    if RecomputeModule.MOE_ACT in modules:
        elements += _moe_act_elements(profile, layer, tp)[1]
    m = max(1, round(tokens))
    for module, (gemms, _, streamed) in (
        (RecomputeModule.MLA_UP_PROJ, _mla_up(profile, tp)),
        (RecomputeModule.MLP, _dense_mlp(profile, layer, tp, sp)),
    ):
        if module in modules:
            seconds += sum(linear_f(m, n, k) for n, k in gemms)
            elements += streamed
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
    modules = runtime.recompute_modules
    return modules_kept_bytes(
        profile, layer, modules, kept_none=kept_none, kept_core=kept_core, tp=tp, sp=sp, cp=cp
    )
