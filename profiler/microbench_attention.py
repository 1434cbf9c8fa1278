"""The attention curve of a calibration: causal SDPA timed per head size and sequence length."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ..planner.cost.calibrated import CURVE_WIDTH, AttentionCurve
from .microbench_cold import ColdPool
from .microbench_stream import _rotating
from .microbench_timer import Timer

ATTENTION_WIDTH = CURVE_WIDTH
"""heads * head_dim of the attention benchmark: every head size is measured at the same FLOPs
(4 heads of 64, 16 of 16, 2 of 128); the planner reads a point's sequence length back from it
(`CalibratedKernels.attention_s`)."""
ATTENTION_SWEEPS = 3
"""Sweeps over the whole curve, each point timed in every sweep with a third of its calls and
the sweeps averaged. A fused attention's time can move in spells: on this CPU (2026-11-28)
bf16 SDPA's backward at 16 heads of 128 x 16 switched between ~4.5 and ~8 ms for 0.1-1 s at a
time (192 oneDNN matmul primitives per call), so one burst of calls caught one spell (5.26,
5.38, 5.40, 7.43 and 7.83 ms in five calibrations of one day) where a training run pays their
mean (7.3 ms per call under the profiler in a 2-rank DDP step). Ten 2-rank rounds of the
backward at 16 and 64 wide heads, 128 and 256 long, one burst of calls against three sweeps
(nothing else running): round-to-round spread (cv) in bf16 21 -> 20%, 22 -> 15%, 26 -> 15%,
18 -> 14%; in fp32 23 -> 16%, 11 -> 16%, 18 -> 19%, 11 -> 30% (one round's sweep at 2x, which
the rounds' median drops). The median of three rounds, what a calibration keeps, moved by 0.14
instead of 0.55 ms at GPT-2 tiny's bf16 point."""


def attention_curve(
    timer: Timer,
    dtype: torch.dtype,
    seqs: tuple[int, ...],
    head_dims: tuple[int, ...],
    pool: ColdPool,
) -> AttentionCurve:
    """Causal SDPA forward and backward rates against the dense forward FLOPs
    (4 * heads * S^2 * head_dim per sequence: QK^T and AV), for each head size, operands from
    memory; each point the mean of `ATTENTION_SWEEPS` sweeps over the whole curve, each
    timing its share of the calls."""
    xs = [4.0 * ATTENTION_WIDTH * s * s for s in seqs]
    points = [(d, s, dense) for d in head_dims for s, dense in zip(seqs, xs, strict=True)]
    fwd_s = [0.0] * len(points)
    train_s = [0.0] * len(points)
    for _ in range(ATTENTION_SWEEPS):
        for i, (d, s, _dense) in enumerate(points):
            shape = (1, max(1, ATTENTION_WIDTH // d), s, d)  # (B, H, T, D)
            fwd = pool.operands([shape] * 3)
            train = pool.operands([shape] * 4, requires_grad=True)
            with torch.no_grad():
                fwd_s[i] += timer(partial(_rotating, _sdpa, fwd), share=ATTENTION_SWEEPS)
            train_s[i] += timer(partial(_rotating, _sdpa_train, train), share=ATTENTION_SWEEPS)
    sweeps = float(ATTENTION_SWEEPS)
    f_rates = [
        dense / max(f / sweeps, 1e-9) for (_, _, dense), f in zip(points, fwd_s, strict=True)
    ]
    b_rates = [
        dense / max((t - f) / sweeps, 1e-9)
        for (_, _, dense), f, t in zip(points, fwd_s, train_s, strict=True)
    ]
    return AttentionCurve(
        head_dims=head_dims,
        dense_fwd_flops=tuple(xs),
        fwd_flops_per_s=tuple(f_rates),
        bwd_flops_per_s=tuple(b_rates),
    )


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention (B, H, T, D) -> (B, H, T, D)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_train(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> None:
    """Forward and backward of `_sdpa` (gradients returned, not accumulated into the leaves)."""
    torch.autograd.grad(_sdpa(q, k, v), (q, k, v), grad.detach())
