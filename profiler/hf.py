"""Hugging Face models from their config classes (never from the hub): the presets, config
files, the shape facts the planner reads, and example inputs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Config kwargs of the presets (architecture papers cited in planner/model_spec.py).
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "num_key_value_heads": 8,
           "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}
HF_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2"},
    "gpt2-xl": {"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25},
    "llama3-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32},
    "llama3-70b": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672,
                   "num_hidden_layers": 80, "num_attention_heads": 64},
    "llama3-405b": {**_LLAMA3, "hidden_size": 16384, "intermediate_size": 53248,
                    "num_hidden_layers": 126, "num_attention_heads": 128},
    "mixtral-8x7b": {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2,
                     "max_position_embeddings": 32768, "tie_word_embeddings": False},
}  # fmt: skip


def load_config(source: str | dict[str, Any]) -> Any:
    """A transformers config from a preset name, a config.json path, or a dict with
    `model_type`. Errors name the value and the accepted forms."""
    from transformers import AutoConfig

    if isinstance(source, dict):
        data = dict(source)
        where = "config dict"
    elif source.lower() in HF_PRESETS:
        data = dict(HF_PRESETS[source.lower()])
        where = f"preset {source!r}"
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(
                f"--model {source!r}: not a Hugging Face preset ({', '.join(HF_PRESETS)}) nor a "
                "config.json file"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"config file {source!r} is not valid JSON: {exc}") from None
        where = f"config file {source!r}"
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError(f"{where}: no 'model_type' (e.g. gpt2, llama, bert, mixtral)")
    try:
        return AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported: {exc}") from None


def build_model(config: Any, *, device: str | torch.device = "meta",
                dtype: torch.dtype = torch.float32) -> nn.Module:  # fmt: skip
    """The training model for `config` (causal LM, or masked LM for BERT), random weights."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config.use_cache = False
    auto = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
    with torch.device(device):
        model = auto.from_config(config, torch_dtype=dtype)
    return model.train()


@dataclass(frozen=True, slots=True)
class Shape:
    """The transformer shape facts the planner needs (`ModelProfile` fields)."""

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    experts: int
    top_k: int
    tied: bool
    max_seq: int


def shape_of(config: Any) -> Shape:
    """Shape facts from a transformers config (GPT-2, Llama, BERT, Mixtral naming)."""
    g = lambda *names, default=0: next(  # noqa: E731
        (getattr(config, n) for n in names if getattr(config, n, None) is not None), default
    )
    hidden = g("hidden_size", "n_embd")
    heads = g("num_attention_heads", "n_head")
    return Shape(
        hidden=hidden,
        heads=heads,
        kv_heads=g("num_key_value_heads", default=heads),
        ffn=g("intermediate_size", "n_inner", default=4 * hidden) or 4 * hidden,
        vocab=g("vocab_size"),
        experts=g("num_local_experts", default=0),
        top_k=g("num_experts_per_tok", default=0) if g("num_local_experts", default=0) else 0,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        max_seq=g("max_position_embeddings", "n_positions", default=2048),
    )


def example_inputs(config: Any, batch: int, seq_len: int, device: str | torch.device) -> dict:
    """Synthetic token ids (and labels, so the model computes its loss)."""
    vocab = shape_of(config).vocab
    ids = torch.randint(0, vocab, (batch, seq_len), device="cpu").to(device)
    return {"input_ids": ids, "labels": ids.clone()}
