"""What the GEMM library keeps resident per distinct shape (`paraplan calibrate`, CPU).

On a CPU, torch runs bf16 matmuls through oneDNN, which generates a kernel for each distinct
problem (shapes, layouts, transposes) and keeps it in its primitive cache (capacity 1024
primitives by default, `ONEDNN_PRIMITIVE_CACHE_CAPACITY`; oneDNN's "Primitive Cache" guide).
Each costs resident memory: measured here, 547 KiB per distinct bf16 shape, linear over 12 and
48 new shapes, after 6 MiB for the first four; fp32 matmuls (MKL) cost ~30 KiB per shape
(2026-11-25). A bf16 GPT-2 tiny step started 14 MiB above the same fp32 step for that reason, a
gap the calibrated memory model missed (bf16 runs +5-7%, fp32 +2%).

The measurement: resident memory less the allocator's free bytes (`host_memory`) before and
after `CACHE_WARM_SHAPES` matmuls of new shapes, then after `CACHE_SHAPES` more; the slope is
the per-shape cost and the rest of the first step the one-time cost. On a GPU, cuBLAS keeps no
per-shape host state of note: both are 0.
"""

from __future__ import annotations

import gc
import itertools

import torch

from .host_memory import live_resident_bytes

CACHE_WARM_SHAPES = 4
"""New shapes run before the slope is measured (they hold the one-time cost)."""
CACHE_SHAPES = 24
"""New shapes the slope is measured over."""
_M = (40, 56, 72, 88, 104, 120, 136, 152)
_KN = (48, 80, 112)
"""Odd sizes no other benchmark or warm-up step uses before this one (each shape is new)."""


def gemm_cache_bytes(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    """(one-time bytes, bytes per distinct shape) that matmuls in `dtype` leave resident."""
    if device.type != "cpu":
        return 0.0, 0.0
    shapes = list(itertools.product(_M, _KN, _KN))[: CACHE_WARM_SHAPES + CACHE_SHAPES]
    marks = [live_resident_bytes()]
    for i, (m, k, n) in enumerate(shapes, start=1):
        x = torch.ones(m, k, dtype=dtype)
        w = torch.ones(n, k, dtype=dtype)  # stored as an nn.Linear's weight (its GEMM path)
        torch.mm(x, w.t())
        del x, w
        if i == CACHE_WARM_SHAPES:
            gc.collect()
            marks.append(live_resident_bytes())
    gc.collect()
    marks.append(live_resident_bytes())
    per_shape = max(0.0, (marks[2] - marks[1]) / CACHE_SHAPES)
    first = max(0.0, marks[1] - marks[0] - CACHE_WARM_SHAPES * per_shape)
    return first, per_shape
