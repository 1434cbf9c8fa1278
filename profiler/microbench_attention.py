"""The attention curve of a calibration: causal SDPA timed per head size and sequence length."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ..planner.cost.calibrated import AttentionCurve
from .microbench_cold import ColdPool
from .microbench_stream import _rotating
from .microbench_timer import Timer

ATTENTION_WIDTH = 256
"""heads * head_dim of the attention benchmark: every head size is measured at the same FLOPs
(4 heads of 64, 16 of 16, 2 of 128)."""


def attention_curve(
    timer: Timer,
    dtype: torch.dtype,
    seqs: tuple[int, ...],
    head_dims: tuple[int, ...],
    pool: ColdPool,
) -> AttentionCurve:
    """Causal SDPA forward and backward rates against the dense forward FLOPs
    (4 * heads * S^2 * head_dim per sequence: QK^T and AV), for each head size, operands from
    memory."""
    xs = [4.0 * ATTENTION_WIDTH * s * s for s in seqs]
    f_rates, b_rates = [], []
    for d in head_dims:
        for s, dense in zip(seqs, xs, strict=True):
            shape = (1, max(1, ATTENTION_WIDTH // d), s, d)  # (B, H, T, D)
            fwd = pool.operands([shape] * 3)
            train = pool.operands([shape] * 4, requires_grad=True)
            with torch.no_grad():
                f_s = timer(partial(_rotating, _sdpa, fwd))
            t_s = timer(partial(_rotating, _sdpa_train, train))
            f_rates.append(dense / max(f_s, 1e-9))
            b_rates.append(dense / max(t_s - f_s, 1e-9))
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
