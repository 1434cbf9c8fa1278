"""The host cost of activation-checkpoint regions (`paraplan calibrate`).

The executor wraps each fully recomputed block in torch's non-reentrant checkpoint (the
composable `checkpoint`, same machinery as `torch.utils.checkpoint(use_reentrant=False)`).
Beyond re-running the block's forward, each region costs Python work of its own, in two
parts:

- per region: the frame that records what the forward saved, and the recompute's entry and
  exit;
- per saved tensor: the saved-tensor hooks pack every tensor autograd saves in the forward
  into a holder, the recompute packs it again into the frame, and the backward unpacks it
  (`torch/utils/checkpoint.py`, `_checkpoint_hook`, `_recomputation_hook`).

Measured on this VM (2026-11-26, one thread, the thread's CPU time): blocks of 1, 4 and 16
Linear+GELU pairs (3, 12 and 48 saved tensors) cost 217, 393 and 997 us per region beyond
their recomputed forward: ~165 us per region plus ~17 us per saved tensor, with torch's and
the composable checkpoint alike. A Hugging Face GPT-2 block saves 27 tensors: 0.58-0.73 ms
measured against 0.28 ms that a fixed per-region figure (from a 5-tensor block) priced.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .microbench_timer import Timer

REGIONS = 4
"""Checkpointed blocks of the benchmark."""
WIDTH = 16
"""Width of each block's Linears: tiny, so kernels are cheap."""
ROUNDS = 7
"""Rounds of the three timings per depth (their median difference is kept)."""
DEPTHS = (1, 8)
"""Linear+GELU pairs per block in the two measurements (the saved tensors grow with them)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionCost:
    """Host seconds a checkpoint region adds beyond its recomputed forward."""

    region_s: float
    """Fixed seconds per region."""
    saved_tensor_s: float
    """Seconds per tensor the region's forward saves for backward."""


def _blocks(depth: int, dev: torch.device, dtype: torch.dtype) -> list[nn.Module]:
    return [
        nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(WIDTH, WIDTH), nn.GELU())]).to(
            dev, dtype
        )
        for _ in range(REGIONS)
    ]


def saved_tensors(fn: object) -> int:
    """Tensors autograd saves while `fn()` runs (what a checkpoint's hooks see)."""
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()  # type: ignore[operator]
    return count


def _region_extra(timer: Timer, depth: int, dtype: torch.dtype) -> tuple[float, float]:
    """(seconds one region adds beyond its recomputed forward, tensors it saves): the median
    over `ROUNDS` rounds of the difference, each round timing all three in turn (a slow spell
    of a shared machine then falls on one round's three, not on one of them)."""
    dev = timer.device
    blocks = _blocks(depth, dev, dtype)
    x = torch.randn(4, WIDTH, device=dev, dtype=dtype, requires_grad=True)

    def forward(ckpt: bool) -> torch.Tensor:
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=False) if ckpt else b(h)
        return h

    # host work: on a CPU the calling thread's CPU time, which a neighbour's preemption
    # does not inflate (wall time on a shared 2-core VM read 155 us per saved tensor against
    # 17); on a GPU wall time, as a synchronize may spin in the thread
    clock = time.thread_time if dev.type == "cpu" else time.perf_counter
    extras = []
    for _ in range(ROUNDS):
        plain = timer(lambda: forward(False).sum().backward(), clock=clock)
        ckpt = timer(lambda: forward(True).sum().backward(), clock=clock)
        recompute = timer(lambda: forward(False), clock=clock)
        extras.append((ckpt - plain - recompute) / REGIONS)
    saved = saved_tensors(lambda: forward(False)) / REGIONS
    return max(0.0, statistics.median(extras)), saved


def checkpoint_region_cost(timer: Timer, dtype: torch.dtype) -> RegionCost:
    """The fixed and per-saved-tensor parts of a region's host cost: a line through the
    blocks of `DEPTHS` (each a difference of fwd+bwd with and without checkpointing, less one
    more forward, graph built)."""
    (s1, n1), (s2, n2) = (_region_extra(timer, d, dtype) for d in DEPTHS)
    per_tensor = max(0.0, (s2 - s1) / (n2 - n1))
    return RegionCost(region_s=max(0.0, s1 - per_tensor * n1), saved_tensor_s=per_tensor)
