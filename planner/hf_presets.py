"""Hugging Face config presets (plain data, no torch): the models `--model NAME` traces.
Architecture sources are cited with the analytic presets in `model_spec.py`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import limits
from .inputs import is_regular_file, read_json
from .limits import Bound, show_number

# Config kwargs of the presets (architecture papers cited in planner/model_spec.py).
_LLAMA3 = {
    "model_type": "llama",
    "vocab_size": 128256,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
HF_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2"},
    "gpt2-xl": {"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25},
    "llama3-8b": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "llama3-70b": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
    },
    "llama3-405b": {
        **_LLAMA3,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    # OpenAI 2025, gpt-oss model card, Table 1 (transformers' GptOssConfig defaults are the
    # 120b's sizes; its `layer_types` alternate sliding and full attention by itself)
    "gpt-oss-120b": {"model_type": "gpt_oss", "num_hidden_layers": 36, "num_local_experts": 128},
    "gpt-oss-20b": {"model_type": "gpt_oss", "num_hidden_layers": 24, "num_local_experts": 32},
    # DeepSeek-AI 2024, DeepSeek-V3 technical report (arXiv 2412.19437) §2.1, §4.2: 61 blocks of
    # hidden 7168, the first 3 dense, multi-head latent attention (128 heads, KV rank 512, query
    # rank 1536, per head 128 + 64 rotary for q and k, 128 for v), 256 routed experts of 2048
    # (8 per token) and 1 shared; transformers' DeepseekV3Config defaults are these sizes. The
    # multi-token-prediction module is not in transformers' model (not traced).
    "deepseek-v3": {"model_type": "deepseek_v3", "vocab_size": 129280},
}


_EXPERTS = replace(limits.EXPERTS, minimum=1)
"""A config that names an expert count has at least one expert."""
_SIZE_KEYS: dict[str, Bound] = {
    "hidden_size": limits.HIDDEN,
    "n_embd": limits.HIDDEN,
    "d_model": limits.HIDDEN,
    "num_hidden_layers": limits.LAYERS,
    "n_layer": limits.LAYERS,
    "num_layers": limits.LAYERS,
    "num_attention_heads": limits.HEADS,
    "n_head": limits.HEADS,
    "num_key_value_heads": limits.HEADS,
    "head_dim": limits.HIDDEN,
    "intermediate_size": limits.FFN,
    "moe_intermediate_size": limits.FFN,
    "n_inner": limits.FFN,
    "vocab_size": limits.VOCAB,
    "max_position_embeddings": limits.SEQ_LEN,
    "n_positions": limits.SEQ_LEN,
    "n_ctx": limits.SEQ_LEN,
    "num_local_experts": _EXPERTS,
    "num_experts": _EXPERTS,
    "n_routed_experts": _EXPERTS,
    "num_experts_per_tok": _EXPERTS,
    "shared_expert_intermediate_size": limits.FFN,
    "intermediate_size_mlp": limits.FFN,
    "kv_lora_rank": limits.HIDDEN,
    "q_lora_rank": limits.HIDDEN,
    "qk_nope_head_dim": limits.HIDDEN,
    "qk_rope_head_dim": limits.HIDDEN,
    "v_head_dim": limits.HIDDEN,
    "sliding_window": limits.SEQ_LEN,
}
"""The size fields of Hugging Face configs (GPT-2, Llama, Mixtral, BERT naming) and their
bounds: each, when present, is a whole number >= 1 within its bound (or null, for `_NULLABLE`)."""
_NULLABLE = frozenset(
    {
        "n_inner",
        "num_key_value_heads",
        "intermediate_size",
        "head_dim",
        "sliding_window",
        "q_lora_rank",
    }
)
"""Sizes a config may give as null, meaning the family's default (4 x hidden, heads,
hidden / heads, no sliding window)."""


def check_hf_config(data: object, where: str) -> dict[str, Any]:
    """`data` as a config dict, its sizes checked before transformers builds anything (a
    zero, a string or a huge size would fail deep inside, or allocate without end)."""
    if not isinstance(data, dict):
        raise ValueError(
            f"{where}: a Hugging Face config is a JSON object, got {type(data).__name__}"
        )
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(
            f"{where}: model_type={show_number(model_type)} must be a model family name such "
            "as gpt2, llama, bert or mixtral"
        )
    for key, bound in _SIZE_KEYS.items():
        value = data.get(key)
        if key in data and (value is not None or key not in _NULLABLE):
            bound.check(value, f"{where}: {key}")
    return data


def check_hf_shape(
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    experts: int,
    top_k: int,
    where: str,
    head_dim: int = 0,
) -> None:
    """The sizes of a built config (defaults of its family applied) that must divide each
    other: the tracer and the planner assume them (an assertion deep inside otherwise). A
    config with its own `head_dim` need not split the hidden size over the heads."""
    if heads < 1 or (hidden % heads and not head_dim):
        raise ValueError(
            f"{where}: hidden size {hidden} is not a multiple of {heads} attention heads; give "
            "heads that divide the hidden size"
        )
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"{where}: {heads} attention heads are not a multiple of {kv_heads} key/value heads "
            "(num_key_value_heads); give key/value heads that divide the heads"
        )
    if experts and not 1 <= top_k <= experts:
        raise ValueError(
            f"{where}: {top_k} experts per token (num_experts_per_tok) is not between 1 and the "
            f"{experts} experts"
        )


def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config.json read through the input layer and checked by `check_hf_config`."""
    hint = "pass a Hugging Face config.json (with model_type) or a preset name"
    data = read_json(path, what="config file", hint=hint)
    return check_hf_config(data, f"config file {os.fspath(path)!r}")


def is_hf_model(source: str) -> bool:
    """Whether `--model` names a Hugging Face preset or config.json (vs an analytic spec). A
    .json file that cannot be read or parsed, or a config whose sizes are out of range, is a
    ValueError naming it (before torch is imported)."""
    if source.lower() in HF_PRESETS:
        return True
    if Path(source).suffix == ".json" and is_regular_file(source):
        data = read_json(source, what="model file", hint="pass a config.json or a spec file")
        if isinstance(data, dict) and "model_type" in data:
            check_hf_config(data, f"config file {source!r}")
            return True
    return False
