"""The transformer shape facts the planner reads, from a transformers config object (no
transformers import: the config is duck-typed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.planner.model import LatentAttention


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """The transformer shape facts the planner needs (`ModelProfile` fields)."""

    hidden: int
    """Model width."""
    heads: int
    """Attention heads."""
    kv_heads: int
    """Key/value heads (GQA; equal to `heads` without it)."""
    ffn: int
    """MLP inner size (per expert for MoE)."""
    vocab: int
    """Vocabulary size."""
    experts: int
    """MoE experts per block (0 for a dense model)."""
    top_k: int
    """Experts each token is routed to (0 for a dense model)."""
    tied: bool
    """Whether the head reuses the embedding matrix."""
    max_seq: int
    """Longest sequence the position embeddings allow."""
    head_dim: int = 0
    """Width of each attention head when the config sets it apart from hidden / heads (Qwen3,
    Gemma, GPT-OSS; under multi-head latent attention, the query and key heads' width); 0
    otherwise (`ModelProfile.head_dim`)."""
    windows: tuple[int, ...] = ()
    """Keys each query of block i attends to, one entry per block (0: the whole sequence); ()
    when no block has a sliding window."""
    dense_ffn: int = 0
    """A MoE model's dense MLP size where the config sets it apart from the experts'
    (`ModelProfile.dense_ffn`); 0 otherwise."""
    shared_expert_ffn: int = 0
    """Inner size of the shared experts, all together (`ModelProfile.shared_expert_ffn`)."""
    latent: LatentAttention | None = None
    """Multi-head latent attention's ranks (`ModelProfile.latent_attention`)."""
    routing_groups: int = 1
    """Expert groups of group-limited routing (`ModelProfile.routing_groups`; 1: none)."""
    routing_group_top_k: int = 1
    """Groups each token may route to (`ModelProfile.routing_group_top_k`)."""
    mtp_modules: int = 0
    """Multi-token-prediction modules the config declares (`ModelProfile.mtp_modules`)."""


def shape_of(config: Any) -> Shape:
    """Shape facts from a transformers config (GPT-2, Llama, BERT, Mixtral naming)."""
    g = lambda *names, default=0: next(  # noqa: E731
        (getattr(config, n) for n in names if getattr(config, n, None) is not None), default
    )
    hidden = g("hidden_size", "n_embd")
    heads = g("num_attention_heads", "n_head")
    head_dim = g("head_dim", default=0)
    if g("kv_lora_rank", default=0) and g("qk_nope_head_dim", default=0):
        # multi-head latent attention (DeepSeek-V2/V3): the scores run over q and k heads of
        # qk_nope_head_dim + qk_rope_head_dim (transformers sets `head_dim` to the rotary
        # part alone), the values, narrower, padded to that width by the flash kernel
        head_dim = g("qk_nope_head_dim") + g("qk_rope_head_dim", default=0)
    experts = g("num_local_experts", "num_experts", "n_routed_experts", default=0)
    # MoE families that keep a dense size beside the experts' (DeepSeek, Qwen2/3-MoE) name the
    # experts' `moe_intermediate_size`; Mixtral's and Llama 4's `intermediate_size` is the
    # experts' (Llama 4's dense blocks: `intermediate_size_mlp`)
    dense = g("intermediate_size", "n_inner", default=4 * hidden) or 4 * hidden
    ffn = (g("moe_intermediate_size", default=0) if experts else 0) or dense
    if experts:
        dense = g("intermediate_size_mlp", default=0) or dense
    shared = g("shared_expert_intermediate_size", default=0) or (
        g("n_shared_experts", default=0) * g("moe_intermediate_size", default=0)
    )
    # group-limited routing (DeepSeek-V2/V3's `n_group` and `topk_group`; some ports name the
    # groups `num_expert_group`): each token picks `topk_group` groups, then its experts there
    groups = g("n_group", "num_expert_group", default=1) if experts else 1
    group_top_k = g("topk_group", default=groups) if groups > 1 else 1
    if not 1 <= group_top_k < groups:
        groups = group_top_k = 1  # every group allowed: not limited
    return Shape(
        head_dim=0 if head_dim * heads == hidden else head_dim,
        hidden=hidden,
        heads=heads,
        kv_heads=g("num_key_value_heads", default=heads),
        ffn=ffn,
        vocab=g("vocab_size"),
        experts=experts,
        top_k=g("num_experts_per_tok", default=0) if experts else 0,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        max_seq=g("max_position_embeddings", "n_positions", default=2048),
        windows=windows_of(config),
        dense_ffn=dense if experts and dense != ffn else 0,
        shared_expert_ffn=shared if experts else 0,
        latent=latent_of(config),
        routing_groups=groups,
        routing_group_top_k=group_top_k,
        # DeepSeek-V3's config.json names them `num_nextn_predict_layers`; transformers' own
        # configs (DeepSeek-V3, GLM-4.5) `num_mtp_layers`, mapped to the former
        mtp_modules=max(0, int(g("num_mtp_layers", "num_nextn_predict_layers", default=0))),
    )


def latent_of(config: Any) -> LatentAttention | None:
    """Multi-head latent attention's ranks as DeepSeek-V2/V3's configs state them (None where
    the config has no `kv_lora_rank`: plain attention)."""
    kv_rank = getattr(config, "kv_lora_rank", None)
    nope = getattr(config, "qk_nope_head_dim", None)
    if not kv_rank or not nope:
        return None
    rope = getattr(config, "qk_rope_head_dim", None) or 0
    return LatentAttention(
        q_lora_rank=getattr(config, "q_lora_rank", None) or 0,
        kv_lora_rank=int(kv_rank),
        qk_rope_head_dim=int(rope),
        v_head_dim=getattr(config, "v_head_dim", None) or int(nope) + int(rope),
    )


def windows_of(config: Any) -> tuple[int, ...]:
    """Each block's sliding window, as transformers configs state it: `sliding_window` (keys
    per query) on the blocks whose `layer_types` entry is "sliding_attention" (GPT-OSS, Gemma
    2/3, Qwen2 with `use_sliding_window`), or on every block where the config has no
    `layer_types` (Mistral); other attention kinds count as attending the whole sequence."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return ()
    if getattr(config, "use_sliding_window", True) is False:
        return ()
    types = getattr(config, "layer_types", None)
    if types is None:
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0)
        return (window,) * int(layers or 0)
    windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()
