"""Hugging Face Llama as a `ChainModule`.

Llama's projections are already separate `nn.Linear`s, so the tensor-parallel plan is
torchtitan's: q/k/v and gate/up by columns, o/down by rows, RMSNorms on sequence shards under
sequence parallelism. Each block is wrapped to compute its rotary embedding, because the HF
decoder layer expects (cos, sin) from the model. Attention must be causal without a mask:
the adapter requires the ``sdpa`` attention implementation (``eager`` would attend to every
position when no mask is passed).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from ..chain import ChainModule, VocabPaths
from ..context_parallel import ContextShard


class LlamaBlock(nn.Module):
    """One decoder layer with its own copy of the rotary embedding (buffers only)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.rotary = copy.deepcopy(rotary)
        self.seq_shards = 1
        """Sequence-parallel degree: the block sees T/seq_shards positions, rotary needs T."""
        self.context_shard: ContextShard | None = None
        """The context-parallel ring (None without CP): this rank's tokens are two chunks of
        the sequence at their global positions."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T, H); (B, T/tp, H) in and out under sequence parallelism
        (T/cp and T/(cp*tp) under context parallelism)."""
        seq = h.shape[1] * self.seq_shards
        if self.context_shard is None:
            pos = torch.arange(seq, device=h.device).unsqueeze(0)  # (1, T)
        else:
            pos = self.context_shard.positions(seq, h.device).unsqueeze(0)  # (1, T/cp)
        cos_sin = self.rotary(h, pos)  # 2 x (1, T, d)
        return self.layer(h, position_embeddings=cos_sin)


class LlamaEmbedding(nn.Module):
    """Token embedding (Llama has no position embedding: rotary is applied in attention)."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, H)."""
        return self.embed_tokens(input_ids)


class LlamaHead(nn.Module):
    """Final RMSNorm and output projection."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> logits (B, T, V)."""
        return self.lm_head(self.norm(h))


def llama_tp_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """torchtitan's Llama plan (parallelize_llama.apply_tp), for a `LlamaBlock`."""
    cols = (
        "layer.self_attn.q_proj",
        "layer.self_attn.k_proj",
        "layer.self_attn.v_proj",
        "layer.mlp.gate_proj",
        "layer.mlp.up_proj",
    )
    if not sequence_parallel:
        # replicated inputs enter attention and the MLP as DTensors: q/k/v's (gate/up's)
        # partial input gradients are summed before one all-reduce (Megatron's f operator)
        return {
            "layer.self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Replicate()},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=False,
            ),
            "layer.mlp": PrepareModuleInput(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Replicate(),),
                use_local_output=False,
            ),
            **{c: ColwiseParallel() for c in cols},
            "layer.self_attn.o_proj": RowwiseParallel(),
            "layer.mlp.down_proj": RowwiseParallel(),
        }
    return {
        "layer.input_layernorm": SequenceParallel(),
        # the HF layer passes hidden_states to self_attn by keyword
        "layer.self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=False,  # a DTensor: one reduce-scatter of the summed gradients
        ),  # (B, T/tp, H) -> (B, T, H)
        **{c: ColwiseParallel() for c in cols},
        "layer.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "layer.post_attention_layernorm": SequenceParallel(),
        "layer.mlp": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        "layer.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def llama_hf_names(
    tensors: dict[str, torch.Tensor], *, tied: bool = False
) -> dict[str, torch.Tensor]:
    """Full tensors by chain name -> by `LlamaForCausalLM` name (same layouts). With tied
    embeddings a head copy of the matrix maps to ``model.embed_tokens.weight``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        part, _, rest = name.partition(".")
        if part == "embed":
            out[f"model.{rest}"] = t
        elif part == "head" and rest == "lm_head.weight":
            out["model.embed_tokens.weight" if tied else "lm_head.weight"] = t
        elif part == "head":
            out[f"model.{rest}"] = t
        else:
            index, _, inner = rest.partition(".")
            out[f"model.layers.{index}.{inner.removeprefix('layer.')}"] = t
    return out


def llama_chain_module(model: Any, *, family: str = "llama") -> ChainModule:
    """Wrap a `LlamaForCausalLM`'s parts (no copy of parameters) as a chain; a
    `MixtralForCausalLM` (the same layout, MoE blocks) as family ``mixtral``, without a
    tensor-parallel plan (its experts run under data and expert parallelism)."""
    impl = model.config._attn_implementation
    if impl != "sdpa":
        raise ValueError(
            f"{type(model).__name__} attention implementation {impl!r}: the executor runs "
            "blocks without a mask and needs 'sdpa' (causal without a mask); build the model "
            "with attn_implementation='sdpa'"
        )
    inner = model.model
    blocks = [LlamaBlock(layer, inner.rotary_emb) for layer in inner.layers]
    tied = model.lm_head.weight is inner.embed_tokens.weight
    chain = ChainModule(
        LlamaEmbedding(inner.embed_tokens),
        blocks,
        LlamaHead(inner.norm, model.lm_head),
        family=family,
        tp_plan=llama_tp_plan if family == "llama" else None,
        hf_names=functools.partial(llama_hf_names, tied=tied),
        vocab=VocabPaths(embedding="embed_tokens", projection="lm_head"),
    )
    if tied:
        chain.tied = ("embed.embed_tokens.weight", "head.lm_head.weight")
    return chain
