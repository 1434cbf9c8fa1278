"""Resident memory of the GEMM library's per-shape kernels on a calibrated CPU.

oneDNN, which runs torch's bf16 matmuls on a CPU, generates one kernel per distinct problem and
keeps it in its primitive cache (`profiler/microbench_cache.py` measures the bytes per shape
and the one-time cost, per dtype). A training step runs each of its layers' GEMMs three ways:
the forward (tokens x k) @ (k x n), the input gradient and the weight gradient, each a problem
of its own. Identical blocks share their shapes, so a stage pays for the distinct shapes of its
layers, not for its depth.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..model import LayerCost, ModelProfile
from .calibrated import KernelFit
from .compute import layer_gemms

PRIMITIVE_CACHE_CAPACITY = 1024
"""Primitives oneDNN keeps by default (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`; oneDNN's "Primitive
Cache" guide): beyond it the least recently used are evicted."""
GEMMS_PER_MATMUL = 3
"""Forward, input-gradient and weight-gradient GEMMs of one matmul in training."""


def gemm_kernel_cache_bytes(
    profile: ModelProfile, layers: Iterable[LayerCost], tp: int, fit: KernelFit | None
) -> float:
    """Bytes the GEMM library keeps resident for `layers` on one rank (TP splits the shapes,
    not their number): the one-time cost plus each distinct shape's kernels. 0 without a
    calibration."""
    if fit is None or not (fit.gemm_shape_bytes or fit.gemm_cache_init_bytes):
        return 0.0
    shapes = {(g.n, g.k) for x in layers for g in layer_gemms(profile, x, tp) or ()}
    primitives = min(GEMMS_PER_MATMUL * len(shapes), PRIMITIVE_CACHE_CAPACITY)
    return fit.gemm_cache_init_bytes + primitives * fit.gemm_shape_bytes
