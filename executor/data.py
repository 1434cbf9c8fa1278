"""Synthetic token batches: deterministic per step, learnable, identical on every rank.

Sequence i of step s is an arithmetic progression modulo the vocabulary (random start and
stride), so a model can learn to predict it and the loss falls; the batch is a function of
(seed, step) only, so a resumed run sees the same data as an uninterrupted one.
"""

from __future__ import annotations

import torch

MAX_STRIDE = 7
"""Strides are drawn from 1..MAX_STRIDE: few enough to learn in a few hundred steps."""


def synthetic_tokens(
    batch: int, seq_len: int, vocab: int, *, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels of the global batch of `step`, (batch, seq_len) each."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=gen)  # (B, 1)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch, 1), generator=gen)  # (B, 1)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab  # (B, T+1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # (B, T), (B, T)
