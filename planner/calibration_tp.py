"""Tensor parallelism's host cost, as `paraplan calibrate` measures it on the ranks' mesh.

Under tensor parallelism the executor wraps each block's projections and norms with DTensor
`parallelize_module` (`executor/models/*.py`): every operator on a DTensor runs sharding
propagation in Python before its kernel, and the wrapped modules redistribute their inputs and
outputs. That work is measured on the executor's own blocks, not modelled from operator counts:
counted on single wrapped Linears and priced at a chain of DTensor multiplies, it came to ~3 ms
per GPT-2 tiny block, where the profiler of a 2-rank TP+SP training step showed ~10 ms of
DTensor Python per block (2026-11-25; docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorParallelBlock:
    """Host seconds tensor parallelism adds to one block of one kind, on one rank."""

    gated: bool
    """A gated MLP (Llama's gate, up and down projections) or a plain one (GPT-2)."""
    sequence_parallel: bool
    """Whether the norms run on sequence shards (`SequenceParallel` plus the gathering
    `PrepareModuleInput` of attention and MLP)."""
    fwd_s: float
    """Forward seconds beyond the same block unwrapped."""
    bwd_s: float
    """Backward seconds beyond the same block unwrapped."""

    def __post_init__(self) -> None:
        for name in ("fwd_s", "bwd_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"tensor parallel block {name}={value!r} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorParallelDispatch:
    """What tensor parallelism through DTensor costs on the host, measured on the ranks' mesh
    (`profiler/microbench_tp.py`): for each kind of block the executor wraps, the main thread's
    CPU seconds of a small block's forward and backward, wrapped less unwrapped. CPU time of
    the calling thread, so that waiting for the collectives (priced by the links) is left out
    while issuing them (~0.1 ms each) stays in."""

    blocks: tuple[TensorParallelBlock, ...]
    """One entry per (gated, sequence_parallel) kind measured."""
    loss_fwd_s: float = 0.0
    """Forward seconds torch's vocabulary-parallel cross-entropy (`loss_parallel`, the
    executor's loss under TP) adds over the plain loss on the same shard: its DTensor handlers
    and issuing its three all-reduces (0: calibrated before 2026-11-29, not measured)."""
    loss_bwd_s: float = 0.0
    """The same for its backward."""

    def __post_init__(self) -> None:
        for name in ("loss_fwd_s", "loss_bwd_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"tensor parallel {name}={value!r} must be >= 0")
        kinds = [(b.gated, b.sequence_parallel) for b in self.blocks]
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(
                "tensor parallel blocks must name each (gated, sequence_parallel) kind once; "
                "re-run paraplan calibrate"
            )

    def block_s(self, *, gated: bool, sequence_parallel: bool) -> tuple[float, float]:
        """(forward, backward) host seconds of a block of this kind: the kind measured, else
        the one measured with the same MLP, else any (the nearest kind)."""
        ranked = sorted(
            self.blocks,
            key=lambda b: (b.gated != gated, b.sequence_parallel != sequence_parallel),
        )
        return ranked[0].fwd_s, ranked[0].bwd_s
