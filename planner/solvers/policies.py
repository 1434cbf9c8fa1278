"""Uniform checkpointing policies, the baselines the solvers are compared with.

Schedules on `chain_to_graph(chain)` (node l is layer l-1), written out directly (not through the
DP) so the tests can compare the DP against them:

- store all: every layer keeps what its backward reads; no recomputation.
- full recomputation: every layer but the last keeps only its input (PyTorch's
  `torch.utils.checkpoint` around each block; the loss layer at the end runs normally) and is
  recomputed right before its backward.
- √L segments: `torch.utils.checkpoint.checkpoint_sequential(layers, segments)` with
  round(√L) segments (Chen et al. 2016 §4): all segments but the last keep only their input and
  are recomputed, keeping everything, right before their backward.
"""

from __future__ import annotations

import itertools
from enum import StrEnum

from .chain import LayerChain
from .checkpoint_dp import sqrt_segment_starts
from .graph import OpGraph
from .schedule import Backward, Forward, Op


class Policy(StrEnum):
    """A uniform checkpointing policy."""

    STORE_ALL = "store-all"
    FULL_RECOMPUTE = "full-recompute"
    SQRT_SEGMENTS = "sqrt-segments"


def uniform_schedule(chain: LayerChain, policy: Policy, *, segments: int | None = None) -> list[Op]:
    """The schedule of a uniform `policy` (`segments` only for SQRT_SEGMENTS; default √L)."""
    L = len(chain)
    if policy == Policy.STORE_ALL:
        starts = [L + 1]
    elif policy == Policy.FULL_RECOMPUTE:
        starts = list(range(1, L + 1))
    elif policy == Policy.SQRT_SEGMENTS:
        starts = sqrt_segment_starts(L, segments)
    else:
        raise ValueError(f"policy={policy!r} must be one of {[p.value for p in Policy]}")
    # Segments [starts[i], starts[i+1]) are checkpointed; the last one runs normally.
    bounds = [*starts, L + 1] if starts[-1] <= L else [1, L + 1]
    pieces = list(itertools.pairwise(bounds))
    checkpointed, last = pieces[:-1], pieces[-1]
    ops: list[Op] = []
    for lo, hi in checkpointed:
        ops += [Forward(node=k, keep_saved=False) for k in range(lo, hi)]
    ops += [Forward(node=k, keep_saved=True) for k in range(*last)]
    ops += [Backward(node=k) for k in range(last[1] - 1, last[0] - 1, -1)]
    for lo, hi in reversed(checkpointed):
        ops += [Forward(node=k, keep_saved=True) for k in range(lo, hi)]
        ops += [Backward(node=k) for k in range(hi - 1, lo - 1, -1)]
    return ops


def store_all_ops(model: OpGraph | LayerChain) -> list[Op]:
    """Every node's forward once, keeping what its backward reads, then every backward in
    reverse order: no recomputation (what plain autograd does), on any op graph (a chain is
    its path graph, `chain_to_graph`)."""
    nodes = range(1, len(model) + 1) if isinstance(model, LayerChain) else model.compute_nodes
    return [
        *(Forward(node=i, keep_saved=True) for i in nodes),
        *(Backward(node=i) for i in reversed(nodes)),
    ]
