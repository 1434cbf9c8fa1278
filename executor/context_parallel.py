"""Context parallelism: the sequence split over the ``cp`` mesh axis, attention as a ring.

Causal load balancing (Liu et al. 2023, Ring Attention; the split torch's `context_parallel`
and Megatron-LM use): the sequence is cut into 2*cp equal chunks and CP rank i holds chunks
i and 2*cp-1-i, so every rank attends to the same number of key positions. Every token keeps
its global position (rotary or learned position embeddings see the true index).

Attention is a ring: each rank starts with its own keys and values and, cp-1 times, passes
the block it holds to the next rank while attending to it: per block the masked scores, the
block's output and its log-sum-exp; the blocks merge by log-sum-exp (the online softmax of
flash attention), so the result equals attention over the whole sequence. Gradients flow
back through the same ring (`_RingShift` sends a block's gradient back the way it came).

torch 2.13 ships `torch.distributed.tensor.experimental.context_parallel`, which replaces
`F.scaled_dot_product_attention` by a ring over DTensor with the flash/efficient CUDA kernels;
it does not dispatch the CPU kernel, so gloo runs (the tests) could not use it, and it shards
fixed buffers in place instead of the executor's batches. This module is the one path on CPU
and CUDA: the per-block attention is the exact math (matmul, masked log-sum-exp), which
autograd differentiates, including through the log-sum-exp merge.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .chain import ChainModule

RING_ATTENTION = "paraplan_ring"
"""Name of the ring attention in transformers' `AttentionInterface` registry."""


_IN_RING_CORE = contextvars.ContextVar("paraplan_ring_core", default=False)
"""True while the ring's per-block attention math runs (scores, softmax, merge)."""


def in_ring_core() -> bool:
    """Whether the op running now is part of the ring's attention core: what selective
    recompute drops and recomputes (recompute.py), like SDPA's kernels without CP."""
    return _IN_RING_CORE.get()


@contextlib.contextmanager
def _ring_core() -> Iterator[None]:
    token = _IN_RING_CORE.set(True)
    try:
        yield
    finally:
        _IN_RING_CORE.reset(token)


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextShard:
    """This rank's place on the context-parallel ring."""

    group: dist.ProcessGroup
    """The CP group (ranks holding the other chunks of the same sequences)."""
    ranks: tuple[int, ...]
    """Global ranks of the group, by CP coordinate."""
    rank: int
    """This rank's CP coordinate."""

    @property
    def size(self) -> int:
        """CP degree."""
        return len(self.ranks)

    def chunks(self, cp_rank: int | None = None) -> tuple[int, int]:
        """The two chunk indices (of 2*cp) a CP rank holds."""
        r = self.rank if cp_rank is None else cp_rank
        return r, 2 * self.size - 1 - r

    def positions(
        self, local_len: int, device: torch.device, cp_rank: int | None = None
    ) -> torch.Tensor:
        """Global positions (local_len,) of a CP rank's tokens (two chunks of local_len/2)."""
        half = local_len // 2
        a, b = self.chunks(cp_rank)
        return torch.cat(
            [
                torch.arange(a * half, (a + 1) * half, device=device),
                torch.arange(b * half, (b + 1) * half, device=device),
            ]
        )

    def shard(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's part of sequences (B, T) -> (B, T/cp), chunks i and 2*cp-1-i."""
        seq = tokens.shape[1]
        if seq % (2 * self.size):
            raise ValueError(
                f"sequence length {seq} does not split into 2*cp={2 * self.size} equal chunks "
                "(causal load balancing); use a sequence length divisible by 2*cp"
            )
        parts = tokens.chunk(2 * self.size, dim=1)
        a, b = self.chunks()
        return torch.cat([parts[a], parts[b]], dim=1)


class _RingShift(torch.autograd.Function):
    """Send a tensor to the next rank of the ring and receive the previous rank's; the
    gradient goes the opposite way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: ContextShard) -> torch.Tensor:
        ctx.shard = shard
        return _exchange(x.contiguous(), shard, step=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _exchange(grad.contiguous(), ctx.shard, step=-1), None


def _exchange(x: torch.Tensor, shard: ContextShard, *, step: int) -> torch.Tensor:
    """Send `x` to CP rank (rank + step) and receive from (rank - step), both posted at once."""
    out = torch.empty_like(x)
    to = shard.ranks[(shard.rank + step) % shard.size]
    frm = shard.ranks[(shard.rank - step) % shard.size]
    ops = [
        dist.P2POp(dist.isend, x, to, group=shard.group),
        dist.P2POp(dist.irecv, out, frm, group=shard.group),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard, *, scale: float
) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence.

    q (B, a, t, d), k and v (B, a_kv, t, d) hold this rank's t = T/cp positions (its two
    chunks); a_kv divides a (grouped-query attention: each key/value head serves a/a_kv query
    heads, as Hugging Face's `repeat_kv`). Returns (B, a, t, d) in q's dtype."""
    t, rep = q.shape[2], q.shape[1] // k.shape[1]
    pos_q = shard.positions(t, q.device)  # (t,)
    qf = q.float()
    kv = torch.stack([k, v])  # (2, B, a_kv, t, d): one message per ring step
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    for step in range(shard.size):
        if step:
            kv = _RingShift.apply(kv, shard)
        src = (shard.rank - step) % shard.size  # whose chunks this block is
        pos_k = shard.positions(t, q.device, cp_rank=src)  # (t,)
        allowed = pos_k[None, :] <= pos_q[:, None]  # (t, t) causal, by global position
        if not bool(allowed.any()):
            continue
        with _ring_core():  # selective recompute drops these activations (recompute.py)
            out, lse = _attend_block(qf, kv, allowed, out, lse, rep=rep, scale=scale)
    if out is None:  # step 0 (the diagonal block) always has allowed keys
        raise RuntimeError("ring attention: no block had an allowed key (a causal-mask bug)")
    return out.to(q.dtype)


def _attend_block(
    qf: torch.Tensor,
    kv: torch.Tensor,
    allowed: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    *,
    rep: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries qf (B, a, t, d) over one K/V block kv (2, B, a_kv, t, d) under
    the mask `allowed` (t, t), merged by log-sum-exp into the running (out, lse)."""
    kb = kv[0].float().repeat_interleave(rep, dim=1)  # (B, a, t, d)
    vb = kv[1].float().repeat_interleave(rep, dim=1)  # (B, a, t, d)
    scores = (qf @ kb.transpose(-1, -2)) * scale  # (B, a, t, t)
    # a finite floor, not -inf: a row with no allowed key gets weight exp(floor) = 0 in the
    # merge below instead of NaN (the diagonal block gives every row at least itself)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    lse_b = torch.logsumexp(scores, dim=-1)  # (B, a, t)
    out_b = torch.exp(scores - lse_b.unsqueeze(-1)) @ vb  # (B, a, t, d)
    if out is None or lse is None:
        return out_b, lse_b
    merged = torch.logaddexp(lse, lse_b)  # (B, a, t)
    out = out * torch.exp(lse - merged).unsqueeze(-1) + out_b * torch.exp(lse_b - merged).unsqueeze(
        -1
    )
    return out, merged


def hf_ring_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (B, a, t, d) in, (B, t, a, d) out. The
    ring is the module's `context_shard`; attention is causal (no mask is passed)."""
    shard: ContextShard = module.context_shard  # type: ignore[assignment]
    out = ring_attention(query, key, value, shard, scale=scaling)  # (B, a, t, d)
    return out.transpose(1, 2).contiguous(), None


def apply_cp(chain: ChainModule, shard: ContextShard) -> None:
    """Run `chain`'s attention as a ring over `shard` and give its position-dependent parts
    the load-balanced global positions (in place). Llama-style blocks (Hugging Face attention
    interface) and the GPT-2 adapter's attention are supported."""
    for block in chain.blocks.values():
        aware = [m for m in block.modules() if hasattr(m, "context_shard")]
        if not aware:
            raise ValueError(
                f"context parallelism for a {chain.family!r} chain: its blocks have no "
                "attention the executor can run as a ring; supported: Hugging Face Llama, "
                "Mixtral and GPT-2 (re-plan with --fix cp=1 for this model)"
            )
        for m in aware:
            setattr(m, "context_shard", shard)  # noqa: B010 (a plain attribute, not a submodule)
        for attn in block.modules():
            config = getattr(attn, "config", None)
            if hasattr(attn, "q_proj") and config is not None:  # HF attention: to the ring
                _register_ring()
                own = copy.copy(config)  # this module's own; the model's is untouched
                own._attn_implementation = RING_ATTENTION
                setattr(attn, "config", own)  # noqa: B010
                setattr(attn, "context_shard", shard)  # noqa: B010
    if chain.embed is not None and hasattr(chain.embed, "context_shard"):
        setattr(chain.embed, "context_shard", shard)  # noqa: B010


def _register_ring() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(RING_ATTENTION, hf_ring_attention)
