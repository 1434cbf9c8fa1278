"""A MoE model's layout and multi-head latent attention in Megatron-LM's terms: the flags a plan's
model is written with (`architecture_args`) and what an argument file states of them
(`architecture_said`).

Megatron-Core builds a block's MLP as experts where `moe_layer_freq` says so (an integer n: the
blocks i with i % n == 0, counted from 0; a list: 1 for a MoE block; `models/gpt/
gpt_layer_specs.py`), each expert `moe_ffn_hidden_size` wide and the dense blocks
`ffn_hidden_size` (`TransformerConfig.moe_ffn_hidden_size` defaults to it), with
`moe_shared_expert_intermediate_size` of shared experts beside the routed ones. Multi-head
latent attention is `MLATransformerConfig` (`--multi-latent-attention`): queries through a
`q_lora_rank` down-projection (Megatron-LM's `--q-lora-rank` default None: at full rank), keys and
values from a `kv_lora_rank` latent, heads of `qk_head_dim` plus a rotary `qk_pos_emb_head_dim`,
values `v_head_dim` wide. Hugging Face's DeepSeek configs name the same sizes
`first_k_dense_replace`, `intermediate_size`, `moe_intermediate_size`, `n_shared_experts`,
`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ..planner.plan import ModelInfo
from .megatron_windows import block_bits
from .setup import Stated, StatedArchitecture, StatedLatent


def moe_layer_freq(model: ModelInfo) -> str | None:
    """`--moe-layer-freq` for the plan's blocks (None: every block has experts, Megatron's
    default): a run-length list expression such as ``[0]*3+[1]*58``, which Megatron-LM
    evaluates (`moe_freq_type`)."""
    if not model.experts or not model.dense_blocks:
        return None
    dense = set(model.dense_blocks)
    bits = [0 if i in dense else 1 for i in range(model.num_blocks)]
    return "+".join(f"[{bit}]*{len(list(run))}" for bit, run in itertools.groupby(bits))


def architecture_args(model: ModelInfo) -> list[tuple[str, object]]:
    """The flags of the model's latent attention and MoE layout (none for a plain dense model,
    or for a plan before version 13, which did not record them)."""
    args: list[tuple[str, object]] = []
    mla = model.latent_attention
    if mla is not None:
        args.append(("multi-latent-attention", None))
        if mla.q_lora_rank:  # else queries at full rank (Megatron-LM's default: None)
            args.append(("q-lora-rank", mla.q_lora_rank))
        head = model.head_dim or model.hidden // max(1, model.heads)
        args += [
            ("kv-lora-rank", mla.kv_lora_rank),
            ("qk-head-dim", head - mla.qk_rope_head_dim),
            ("qk-pos-emb-head-dim", mla.qk_rope_head_dim),
            ("v-head-dim", mla.v_head_dim),
        ]
    if model.experts:
        if model.dense_ffn:  # --ffn-hidden-size is then the dense blocks' (`render`)
            args.append(("moe-ffn-hidden-size", model.ffn))
        if model.shared_expert_ffn:
            args.append(("moe-shared-expert-intermediate-size", model.shared_expert_ffn))
        freq = moe_layer_freq(model)
        if freq is not None:
            args.append(("moe-layer-freq", freq))
    return args


def architecture_said(
    args: dict[str, str | None], num: Callable[[str, int], int], source: str
) -> StatedArchitecture:
    """What `args` state of the model's latent attention and MoE layout (nothing where they
    state no model: no `--num-layers`)."""
    if "num-layers" not in args:
        return StatedArchitecture()
    latent = StatedLatent(on="multi-latent-attention" in args)
    if latent.on:
        head = num("qk-head-dim", 1) if "qk-head-dim" in args else None
        rope = num("qk-pos-emb-head-dim", 1) if "qk-pos-emb-head-dim" in args else None
        latent = StatedLatent(
            on=True,
            q_lora_rank=num("q-lora-rank", 0),
            kv_lora_rank=num("kv-lora-rank", 1) if "kv-lora-rank" in args else None,
            qk_head_dim=None if head is None or rope is None else head + rope,
            qk_rope_head_dim=rope,
            v_head_dim=num("v-head-dim", 1) if "v-head-dim" in args else None,
        )
    if "num-experts" not in args:
        return StatedArchitecture(latent=latent)
    blocks = num("num-layers", 1)
    freq = args.get("moe-layer-freq")
    pattern = (
        (True,) * blocks
        if freq is None
        else block_bits(
            freq,
            blocks,
            "--moe-layer-freq",
            source,
            every=lambda i, n: i % n == 0,
            meaning="the blocks 0, n, 2n, ... have experts",
        )
    )
    shared = args.get("moe-shared-expert-intermediate-size")
    return StatedArchitecture(
        dense_ffn=(
            Stated(num("ffn-hidden-size", 1), "--ffn-hidden-size")
            if "ffn-hidden-size" in args and "moe-ffn-hidden-size" in args
            else None
        ),
        shared_expert_ffn=Stated(
            num("moe-shared-expert-intermediate-size", 1) if shared is not None else 0,
            "--moe-shared-expert-intermediate-size"
            if shared is not None
            else "no --moe-shared-expert-intermediate-size",
        ),
        moe_blocks=pattern,
        moe_blocks_flag="--moe-layer-freq" if freq is not None else "no --moe-layer-freq",
        latent=latent,
    )
