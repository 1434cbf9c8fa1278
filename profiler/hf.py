"""Hugging Face models from their config classes (never from the hub): the presets, config
files, example inputs, and `profile_hf` (the shape facts are in `shape`)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paraplan.planner.hf_presets import (
    HF_PRESETS,
    check_hf_config,
    check_hf_shape,
    read_hf_config,
)
from paraplan.planner.limits import PROFILE_TOKENS
from paraplan.planner.model import ModelProfile

from .api import profile
from .chain import module_digest
from .env import quiet_transformers, scoped_env
from .shape import shape_of

HUB_OFFLINE = "HF_HUB_OFFLINE"
"""Set to 1 (unless the caller set it) while transformers runs: configs and models are built
from config classes, never fetched from the hub."""


def load_config(source: str | dict[str, Any]) -> Any:
    """A transformers config from a preset name, a config.json path, or a dict with
    `model_type`. Errors name the value and the accepted forms."""
    if isinstance(source, dict):
        data = dict(check_hf_config(source, "config dict"))
        where = "config dict"
    elif source.lower() in HF_PRESETS:
        data = dict(HF_PRESETS[source.lower()])
        where = f"preset {source!r}"
    else:
        data = dict(read_hf_config(source))  # input layer: size, depth, UTF-8, sizes in range
        where = f"config file {source!r}"
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError(f"{where}: no 'model_type' (e.g. gpt2, llama, bert, mixtral)")
    with scoped_env(HUB_OFFLINE, "1", override=False):
        from transformers import AutoConfig

        try:
            config = AutoConfig.for_model(model_type, **data)
        except (ValueError, KeyError):
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

            close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING_NAMES), n=5)
            hint = f"did you mean {', '.join(close)}?" if close else "see transformers' list"
            raise ValueError(
                f"{where}: model_type {model_type!r} is not a model type transformers knows; {hint}"
            ) from None
        except Exception as exc:
            # the config classes' own field checks (huggingface_hub's strict dataclass errors,
            # TypeError) on values from the user's file: bad input, not a paraplan bug
            problem = " ".join(str(exc).split())
            raise ValueError(f"{where}: transformers refused the config: {problem}") from None
    s = shape_of(config)
    check_hf_shape(
        hidden=s.hidden,
        heads=s.heads,
        head_dim=s.head_dim,
        kv_heads=s.kv_heads,
        experts=s.experts,
        top_k=s.top_k,
        where=where,
    )
    return config


def build_model(
    config: Any, *, device: str | torch.device = "meta", dtype: torch.dtype = torch.float32
) -> nn.Module:
    """The training model for `config` (causal LM, or masked LM for BERT), random weights."""
    with scoped_env(HUB_OFFLINE, "1", override=False):
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

        config.use_cache = False
        auto = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
        with torch.device(device):
            model = auto.from_config(config, dtype=dtype)
    return model.train()


def example_inputs(config: Any, batch: int, seq_len: int, device: str | torch.device) -> dict:
    """Synthetic token ids and labels (so the model computes its loss), no padding."""
    vocab = shape_of(config).vocab
    ids = torch.randint(0, vocab, (batch, seq_len), device="cpu").to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def profile_hf(
    source: str | dict[str, Any],
    *,
    seq_len: int | None = None,
    batch: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    mode: str = "meta",
    progress: bool = False,
    as_run: Callable[[nn.Module], nn.Module | None] | None = None,
) -> ModelProfile:
    """Profile a Hugging Face model given by preset name, config.json path or config dict:
    built on the meta device (mode="meta", nothing allocated) or on the CPU (mode="measure").
    `as_run` maps the model to the module a runtime runs in its place, with the blocks as an
    `nn.ModuleList` named ``layers`` (the front door passes the executor's
    `executed_module`: GPT-2 with q, k and v apart, Llama with a rotary embedding per block),
    or None to trace it as built; the profile keeps the built model's parameter digest."""
    with quiet_transformers():
        return _profile_hf(source, seq_len, batch, dtype, mode, progress, as_run)


def _profile_hf(
    source: str | dict[str, Any],
    seq_len: int | None,
    batch: int,
    dtype: torch.dtype,
    mode: str,
    progress: bool,
    as_run: Callable[[nn.Module], nn.Module | None] | None,
) -> ModelProfile:
    config = load_config(source)
    shape = shape_of(config)
    seq = seq_len or shape.max_seq
    if seq > shape.max_seq:
        raise ValueError(
            f"seq_len={seq} exceeds the model's {shape.max_seq} positions; use a shorter --seq-len"
        )
    PROFILE_TOKENS.check(batch * seq, f"batch {batch} x seq_len {seq}")  # ids made on the CPU
    device = "meta" if mode == "meta" else "cpu"
    try:
        model = build_model(config, device=device, dtype=dtype)
    except Exception as exc:  # a value the config class accepts but the model cannot use
        problem = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ValueError(
            f"transformers could not build the model of {source!r}: {problem}"
        ) from None
    name = (
        source
        if isinstance(source, str) and source.lower() in HF_PRESETS
        else (Path(source).stem if isinstance(source, str) else str(config.model_type))
    )
    digest = module_digest(model)  # of Hugging Face's names: the module users hand the executor
    executed = as_run(model) if as_run is not None else None
    traced = profile(
        executed if executed is not None else model,
        example_inputs(config, batch, seq, device),
        mode=mode,  # type: ignore[arg-type]
        blocks="layers" if executed is not None else None,
        name=name,
        progress=progress,
    )
    return dataclasses.replace(traced, module_digest=digest)
