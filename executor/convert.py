"""Supported models into a `ChainModule`: the one place that knows every adapter in `models/`
(the adapters import `chain`; `chain` imports none of them)."""

from __future__ import annotations

import torch
from torch import nn

from .chain import ChainModule, causal_lm_loss
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


class ExecutedCausalLM(nn.Module):
    """The chain the executor runs, as a module the profiler can trace: embedding, the blocks
    (an `nn.ModuleList`, ``layers``), head, and the executor's loss. Hugging Face's own module
    differs from it inside every block (GPT-2's fused ``c_attn`` and ``Conv1D``s, Llama's
    rotary embedding computed once): a profile of it would price operators, saved tensors
    and parameter tensors that the executor does not run (counted for a GPT-2 block: 39
    forward and 62 backward operators against the executor's 47 and 86)."""

    def __init__(self, chain: ChainModule, config: object = None) -> None:
        super().__init__()
        self.config = config
        """The Hugging Face config (the profiler reads the model's shape from it)."""
        if chain.embed is None or chain.head is None:
            raise ValueError("a pipeline chunk is not a whole model: profile the whole chain")
        self.embed: nn.Module = chain.embed
        self.layers = nn.ModuleList(chain.blocks.values())
        self.head: nn.Module = chain.head

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Token ids and target ids (B, T) -> the mean cross-entropy, as the executor's step."""
        h = self.embed(input_ids)  # (B, T, H)
        for block in self.layers:
            h = block(h)  # (B, T, H)
        return causal_lm_loss(self.head(h), labels)  # logits (B, T, V)


def executed_module(model: nn.Module) -> nn.Module | None:
    """What the executor would run for `model` (converted in place, see `to_chain_module`),
    wrapped for profiling; None for a model the executor does not convert."""
    try:
        return ExecutedCausalLM(to_chain_module(model), getattr(model, "config", None))
    except ValueError:
        return None
