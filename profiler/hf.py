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

from paraplan.planner.hf_presets import HF_PRESETS


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
        model = auto.from_config(config, dtype=dtype)
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
    """Synthetic token ids and labels (so the model computes its loss), no padding."""
    vocab = shape_of(config).vocab
    ids = torch.randint(0, vocab, (batch, seq_len), device="cpu").to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def profile_hf(
    source: str | dict[str, Any], *, seq_len: int | None = None, batch: int = 1,
    dtype: torch.dtype = torch.bfloat16, mode: str = "meta", progress: bool = False,
) -> Any:  # fmt: skip
    """Profile a Hugging Face model given by preset name, config.json path or config dict:
    built on the meta device (mode="meta", nothing allocated) or on the CPU (mode="measure")."""
    from .api import profile

    config = load_config(source)
    shape = shape_of(config)
    seq = seq_len or shape.max_seq
    if seq > shape.max_seq:
        raise ValueError(
            f"seq_len={seq} exceeds the model's {shape.max_seq} positions; use a shorter --seq-len"
        )
    device = "meta" if mode == "meta" else "cpu"
    model = build_model(config, device=device, dtype=dtype)
    name = source if isinstance(source, str) and source.lower() in HF_PRESETS else (
        Path(source).stem if isinstance(source, str) else str(config.model_type)
    )  # fmt: skip
    return profile(model, example_inputs(config, batch, seq, device), mode=mode,  # type: ignore[arg-type]
                   name=name, progress=progress)  # fmt: skip
