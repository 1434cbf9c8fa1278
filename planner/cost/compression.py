"""PowerSGD gradient compression (Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", arXiv 1905.13727), as torch's DDP
`powerSGD_hook` runs it.

Each gradient matrix M (m x n, a weight viewed as its first dim by the rest) is replaced by
a rank-r product P Q^T: one power iteration per step (Algorithm 1) computes P = M Q,
all-reduces P, orthogonalizes it (Gram-Schmidt), computes Q = M^T P and all-reduces Q. Only
(m + n) * r numbers cross the network instead of m * n. A matrix is compressed only when
(m + n) * r * `MIN_COMPRESSION_RATE` < m * n (torch's `min_compression_rate`); vectors
(biases, norms) and matrices too thin to gain are all-reduced uncompressed, as the hook does.
Error feedback (§3, "EF") keeps the residual M - P Q^T in a buffer as large as the gradient,
added to the next step's gradient; warm start keeps P and Q between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import TrainConfig
from ..model import ModelProfile
from ..strategy import Strategy
from .comm import AxisLink, Collectives
from .layout import Stage

POWERSGD_RANKS = (1, 2, 4, 8)
"""Ranks searched (Vogels et al. 2019 Table 3 and §5 train ResNet/LSTM at ranks 1-4; torch's
default is 1); pinned ranks may be any positive integer."""
MAX_POWERSGD_RANK = 1024
"""Largest rank a pin may ask for: beyond it no transformer matrix shrinks 2x."""
MIN_COMPRESSION_RATE = 2
"""torch `PowerSGDState.min_compression_rate` default: compress a matrix only when it shrinks
by more than this factor."""
POWERSGD_START_ITER = 1_000
"""torch `PowerSGDState.start_powerSGD_iter` default: the first steps all-reduce uncompressed
(vanilla), which the paper's authors advise against losing accuracy (torch docs); the cost
model prices the steady state after it."""
FLOPS_PER_MATRIX_ELEMENT_PER_RANK = 6
"""Per rank-r approximation of an m x n matrix: M Q (2 m n r FLOPs), M^T P (2 m n r) and the
error-feedback residual M - P Q^T (2 m n r) (Vogels et al. 2019 Algorithm 1 with EF)."""
PASSES_OVER_GRADIENT = 4
"""Memory passes over each compressed gradient per step: read for M Q, read for M^T P, read
and write for the error-feedback residual (the thin GEMMs are memory-bound: r << m, n)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerSGDCost:
    """What PowerSGD costs one pipeline stage's rank per step."""

    comm_s: float
    """All-reduce seconds: P, then Q (sequential: Q needs the reduced P), plus the
    uncompressed tensors."""
    uncompressed_comm_s: float
    """The plain all-reduce of the same gradients it replaces."""
    compute_s: float
    """Compression compute (thin GEMMs, orthogonalization, error feedback); on the compute
    stream, so never hidden."""
    error_feedback_bytes: float
    """Residual buffer (one gradient-sized buffer of the compressed matrices) plus the
    warm-start P and Q."""
    wire_bytes: float
    """Bytes all-reduced per step (instead of the whole gradient)."""
    gradient_bytes: float
    """Bytes the uncompressed all-reduce would send."""


def block_matrices(p: ModelProfile, block_params: float) -> tuple[tuple[int, int], ...]:
    """A transformer block's weight matrices (rows, cols): q, k, v, o and the MLP's two or
    three (a gated MLP, SwiGLU, when the block holds enough parameters for three)."""
    h, q, kv = p.hidden, p.q_dim, p.kv_dim
    attention = ((h, q), (h, kv), (h, kv), (q, h))
    attn_params = 2 * h * q + 2 * h * kv
    gated = block_params - attn_params >= 3 * h * p.ffn
    mlp = ((h, p.ffn), (h, p.ffn), (p.ffn, h)) if gated else ((h, p.ffn), (p.ffn, h))
    return attention + mlp


def compressed(rows: float, cols: float, rank: int) -> bool:
    """Whether torch's hook compresses a rows x cols matrix at `rank`."""
    return (rows + cols) * rank * MIN_COMPRESSION_RATE < rows * cols


class PowerSGDModel:
    """Prices PowerSGD for a model's stages (matrix shapes from the profile's sizes)."""

    def __init__(self, profile: ModelProfile, flops_per_s: float, memory_bw: float) -> None:
        self.profile = profile
        self.flops_per_s = flops_per_s
        """Achievable FLOP/s of the thin GEMMs' dtype (fp32 gradients)."""
        self.memory_bw = memory_bw
        """Device memory bandwidth, bytes/s."""
        blocks = [x.params for x in profile.layers if x.kind == "block"]
        self._block = block_matrices(profile, max(blocks) if blocks else 0)

    def stage_matrices(self, stage: Stage, tp: int) -> list[tuple[float, float]]:
        """Each matrix of the stage as one TP rank holds it (TP splits one side)."""
        p = self.profile
        out: list[tuple[float, float]] = []
        for rows, cols in self._block:
            out += [(rows, cols / tp)] * stage.n_blocks
        out += [(p.vocab / tp, p.hidden)] * (int(stage.has_embedding) + int(stage.has_head))
        return out

    def cost(
        self, s: Strategy, stage: Stage, link: AxisLink, coll: Collectives, t: TrainConfig
    ) -> PowerSGDCost:
        """PowerSGD at `s.powersgd_rank` over `link` for the stage's dense gradients."""
        r = s.powersgd_rank
        if r is None or r < 1:
            raise ValueError(f"powersgd_rank={r!r} must be a positive integer to price PowerSGD")
        dense = stage.dense_params / s.tp
        p_elems = q_elems = matrix_elems = flops = 0.0
        for rows, cols in self.stage_matrices(stage, s.tp):
            if not compressed(rows, cols, r):
                continue
            p_elems += rows * r
            q_elems += cols * r
            matrix_elems += rows * cols
            # Gram-Schmidt of P: about 2 m r^2 FLOPs (Vogels et al. 2019 Algorithm 1, line 4)
            flops += FLOPS_PER_MATRIX_ELEMENT_PER_RANK * rows * cols * r + 2 * rows * r * r
        matrix_elems = min(matrix_elems, dense)
        plain_elems = dense - matrix_elems
        gb = t.grad_bytes
        comm = coll.all_reduce(p_elems * gb, link) + coll.all_reduce(q_elems * gb, link)
        if plain_elems > 0:
            comm += coll.all_reduce(plain_elems * gb, link)
        nbytes = PASSES_OVER_GRADIENT * matrix_elems * gb
        compute = max(flops / self.flops_per_s, nbytes / self.memory_bw) if matrix_elems else 0.0
        return PowerSGDCost(
            comm_s=comm,
            uncompressed_comm_s=coll.all_reduce(dense * gb, link),
            compute_s=compute,
            error_feedback_bytes=(matrix_elems + p_elems + q_elems) * gb,
            wire_bytes=(p_elems + q_elems + plain_elems) * gb,
            gradient_bytes=dense * gb,
        )
