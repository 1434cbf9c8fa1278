"""The host cost of one activation-checkpoint region (`paraplan calibrate`).

The executor wraps each fully recomputed block in `torch.utils.checkpoint` (non-reentrant).
Beyond re-running the block's forward, each region costs Python work of its own: the saved-tensor
hooks that stash and unpack its inputs, the frame that records what the forward saved, and the
recompute's entry and exit. On a CPU that is ~0.7 ms per region, profiled on 2026-11-25 (GPT-2
tiny, 4 regions: `DistributedDataParallel.forward`'s own time went from 1.2 to 4.3 ms), which
the forward's operators do not account for."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .microbench import Timer

REGIONS = 4
"""Checkpointed blocks of the benchmark."""
WIDTH = 16
"""Width of each block (two width x width Linears around a GELU): tiny, so kernels are cheap."""


def checkpoint_region_s(timer: Timer, dtype: torch.dtype) -> float:
    """Seconds one checkpoint region adds to a training step beyond its recomputed forward:
    (forward+backward with every block checkpointed) - (without) - (one more forward, graph
    built), over `REGIONS` blocks."""
    dev = timer.device
    blocks = [
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH)).to(dev, dtype)
        for _ in range(REGIONS)
    ]
    x = torch.randn(4, WIDTH, device=dev, dtype=dtype, requires_grad=True)

    def forward(ckpt: bool) -> torch.Tensor:
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=False) if ckpt else b(h)
        return h

    plain = timer(lambda: forward(False).sum().backward())
    ckpt = timer(lambda: forward(True).sum().backward())
    recompute = timer(lambda: forward(False))
    return max(0.0, (ckpt - plain - recompute) / REGIONS)
