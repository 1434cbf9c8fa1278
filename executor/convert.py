"""Supported models into a `ChainModule`: the one place that knows every adapter in `models/`
(the adapters import `chain`; `chain` imports none of them)."""

from __future__ import annotations

from torch import nn

from .chain import ChainModule
from .models.gpt2 import gpt2_chain_module
from .models.llama import llama_chain_module


def to_chain_module(model: nn.Module) -> ChainModule:
    """Convert a supported model to a `ChainModule`: a `ChainModule` as is, Hugging Face
    `GPT2LMHeadModel`, `LlamaForCausalLM` or `MixtralForCausalLM` (modified in place,
    parameters reused)."""
    if isinstance(model, ChainModule):
        return model
    name = type(model).__name__
    if name == "GPT2LMHeadModel":
        return gpt2_chain_module(model)
    if name == "LlamaForCausalLM":
        return llama_chain_module(model)
    if name == "MixtralForCausalLM":
        return llama_chain_module(model, family="mixtral")
    raise ValueError(
        f"cannot parallelize a {name}: the executor knows Hugging Face GPT2LMHeadModel, "
        "LlamaForCausalLM and MixtralForCausalLM; wrap other models as "
        "paraplan.executor.ChainModule(embed, blocks, head, tp_plan=...) whose forward maps "
        "token ids (B, T) to logits (B, T, V)"
    )
