"""Hugging Face GPT-2 as a `ChainModule`, ready for tensor parallelism.

GPT-2 stores its projections as `Conv1D` (y = x @ W + b, W of shape (in, out)) and fuses
q, k and v in one `c_attn`. A column split of the fused matrix would hand each rank a mix of
q, k and v columns, so the adapter converts every `Conv1D` to `nn.Linear` (W transposed) and
splits `c_attn` into `q_proj`, `k_proj`, `v_proj`; attention then reshapes with
`view(B, T, -1, head_dim)` and each tensor-parallel rank computes its own heads (Megatron-LM,
Shoeybi et al. 2019 §3). `hf_names` maps tensors back to the original names and layouts.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
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
from ..context_parallel import ContextShard, ring_attention

_QKV = ("q_proj", "k_proj", "v_proj")


def linear_from_conv1d(conv: Any) -> nn.Linear:
    """An `nn.Linear` computing the same map as a transformers `Conv1D` (weight transposed)."""
    fan_in, fan_out = conv.weight.shape  # Conv1D weight: (in, out)
    lin = nn.Linear(fan_in, fan_out, bias=conv.bias is not None, device=conv.weight.device)
    with torch.no_grad():
        lin.weight = nn.Parameter(conv.weight.detach().t().contiguous())  # (out, in)
        if conv.bias is not None:
            lin.bias = nn.Parameter(conv.bias.detach().clone())
    return lin


class SplitQKVAttention(nn.Module):
    """GPT-2 causal self-attention with separate q/k/v projections (same numerics)."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear

    def __init__(self, attn: Any) -> None:
        super().__init__()
        if getattr(attn, "is_cross_attention", False):
            raise ValueError(
                "GPT-2 cross-attention is not supported; use add_cross_attention=False"
            )
        hidden = attn.embed_dim
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)  # head_dim**-0.5, divided by (layer+1) when set
        self.dropout_p = float(attn.attn_dropout.p)
        fused = attn.c_attn.weight.detach()  # (H, 3H): columns are q | k | v
        fused_bias = attn.c_attn.bias.detach()  # (3H,)
        for i, name in enumerate(_QKV):
            lin = nn.Linear(hidden, hidden, device=fused.device)
            lin.weight = nn.Parameter(fused[:, i * hidden : (i + 1) * hidden].t().contiguous())
            lin.bias = nn.Parameter(fused_bias[i * hidden : (i + 1) * hidden].clone())
            setattr(self, name, lin)
        self.c_proj = linear_from_conv1d(attn.c_proj)
        self.resid_dropout = attn.resid_dropout
        self.context_shard: ContextShard | None = None
        """The context-parallel ring (None without CP)."""

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object):
        """(B, T, H) -> ((B, T, H), None); the mask arguments of the HF block are ignored:
        attention is causal. Under TP each rank holds H/tp of q, k, v: its heads."""
        b, t = hidden_states.shape[0], hidden_states.shape[1]
        q = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, a, T, d)
        k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, a, T, d)
        v = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, a, T, d)
        if self.context_shard is not None:  # this rank's T/cp positions, keys from the ring
            y = ring_attention(q, k, v, self.context_shard, scale=self.scaling)
        else:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=self.dropout_p if self.training else 0.0,
                is_causal=True,
                scale=self.scaling,
            )  # (B, a, T, d)
        y = y.transpose(1, 2).reshape(b, t, -1)  # (B, T, a*d)
        return self.resid_dropout(self.c_proj(y)), None  # (B, T, H)


class GPT2Embedding(nn.Module):
    """Token plus learned position embeddings, then dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop
        self.context_shard: ContextShard | None = None
        """The context-parallel ring (None without CP): the tokens' global positions."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, H); T/cp tokens at their global positions under CP."""
        seq = input_ids.shape[1]
        if self.context_shard is None:
            pos = torch.arange(seq, device=input_ids.device)  # (T,)
        else:
            pos = self.context_shard.positions(seq, input_ids.device)  # (T/cp,)
        return self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, H)


class GPT2Head(nn.Module):
    """Final LayerNorm and the (tied) output projection."""

    def __init__(self, ln_f: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> logits (B, T, V)."""
        return self.lm_head(self.ln_f(h))


def gpt2_tp_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Megatron-style split of a converted GPT2Block: q/k/v and c_fc by columns (heads,
    inner units), c_proj by rows; with sequence parallelism the LayerNorms and dropouts run
    on sequence shards (Korthikanti et al. 2022 §4.2.2), as torchtitan's Llama plan."""
    if not sequence_parallel:
        # the replicated input enters attention as a DTensor, so that q, k and v's partial
        # input gradients are summed before the one all-reduce of Megatron's f operator (a
        # local tensor makes each of them all-reduce its own)
        shared = PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,
        )
        return {
            "attn": shared,
            **{f"attn.{n}": ColwiseParallel() for n in _QKV},
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        }
    # (B, T/tp, H) -> (B, T, H) all-gather, kept a DTensor: the column-parallel Linears
    # reading it (q, k, v; c_fc) return partial input gradients that autograd sums before one
    # reduce-scatter back to (B, T/tp, H), Megatron's count; a local tensor instead makes each
    # Linear all-reduce its own full-size gradient (3 per attention, 1 per MLP)
    gather = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=False
    )
    return {
        "ln_1": SequenceParallel(),
        "attn": gather,
        **{f"attn.{n}": ColwiseParallel() for n in _QKV},
        "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter to (B, T/tp, H)
        "ln_2": SequenceParallel(),
        "mlp": gather,
        "mlp.c_fc": ColwiseParallel(),
        "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def gpt2_hf_names(
    tensors: dict[str, torch.Tensor], *, tied: bool = True
) -> dict[str, torch.Tensor]:
    """Full tensors by chain name -> by `GPT2LMHeadModel` name, Conv1D layout, fused c_attn.
    With tied embeddings a head copy of the matrix maps to ``transformer.wte.weight``."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        part, _, rest = name.partition(".")
        if part == "embed":
            out[f"transformer.{rest}"] = t
        elif part == "head" and rest == "lm_head.weight":
            out["transformer.wte.weight" if tied else "lm_head.weight"] = t
        elif part == "head":
            out[f"transformer.{rest}"] = t
        else:
            index, _, inner = rest.partition(".")
            key = f"transformer.h.{index}.{inner}"
            module, _, leaf = inner.rpartition(".")
            if module.split(".")[-1] in _QKV:
                qkv.setdefault(f"transformer.h.{index}.attn.c_attn.{leaf}", {})[module[-6:]] = t
            elif leaf == "weight" and module.split(".")[-1] in ("c_proj", "c_fc"):
                out[key] = t.t()  # Linear (out, in) -> Conv1D (in, out)
            else:
                out[key] = t
    for key, parts in qkv.items():
        fused = torch.cat([parts[n] for n in _QKV], dim=0)  # (3H, H) or (3H,)
        out[key] = fused.t() if key.endswith("weight") else fused
    return out


def gpt2_chain_module(model: Any) -> ChainModule:
    """Convert a `GPT2LMHeadModel` in place and return its chain."""
    cfg = model.config
    if getattr(cfg, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True is not supported; set it False")
    tr = model.transformer
    for block in tr.h:
        if not isinstance(block.attn, SplitQKVAttention):
            block.attn = SplitQKVAttention(block.attn)
            block.mlp.c_fc = linear_from_conv1d(block.mlp.c_fc)
            block.mlp.c_proj = linear_from_conv1d(block.mlp.c_proj)
    tied = model.lm_head.weight is tr.wte.weight
    chain = ChainModule(
        GPT2Embedding(tr.wte, tr.wpe, tr.drop),
        list(tr.h),
        GPT2Head(tr.ln_f, model.lm_head),
        family="gpt2",
        tp_plan=gpt2_tp_plan,
        hf_names=functools.partial(gpt2_hf_names, tied=tied),
        vocab=VocabPaths(embedding="wte", projection="lm_head"),
    )
    if tied:
        chain.tied = ("embed.wte.weight", "head.lm_head.weight")
    return chain
