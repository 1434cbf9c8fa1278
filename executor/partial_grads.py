"""Pending (`Partial`) gradients reduced once, before the optimizer step.

Under sequence parallelism the norms' parameters are replicated over the tensor-parallel
ranks, each of which sees a slice of the sequence, so their DTensor gradients come out of
the backward as `Partial(sum)`. DTensor reduces a Partial tensor lazily, each time an operator
reads it, and does not keep the result: AdamW reads a gradient three times (the first moment,
then twice in the second), so every such gradient cost three all-reduces per step, one per
tensor (48 of them for GPT-2 tiny's 16 norm parameters, ~0.5-1 ms each on gloo, measured
2026-11-25 with the profiler on a 2-rank TP+SP step). Megatron-LM reduces these gradients once,
in one flattened all-reduce over the tensor-parallel group (`allreduce_layernorm_grads`,
Korthikanti et al. 2022 §4.2.2); so does this module: the local tensors of every Partial
gradient are grouped by (mesh, mesh dimension, reduce op, dtype), flattened, all-reduced once
per group, and put back as the same placements with Partial replaced by Replicate. The values
equal DTensor's own reduction (a sum over the same ranks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import Partial

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
"""Partial reduce ops this module reduces itself (others are left to DTensor)."""


def _pending(p: nn.Parameter) -> DTensor | None:
    g = p.grad
    if isinstance(g, DTensor) and any(
        isinstance(pl, Partial) and pl.reduce_op in _OPS for pl in g.placements
    ):
        return g
    return None


@torch.no_grad()
def reduce_partial_grads(params: Iterable[nn.Parameter]) -> int:
    """All-reduce the Partial gradients of `params` once (one collective per mesh dimension,
    reduce op and dtype) and store them Replicate; returns the collectives issued. Every rank
    of each group must call it with the same parameters (all of a chunk's, in order)."""
    pending = [(p, g) for p in params if (g := _pending(p)) is not None]
    if not pending:
        return 0
    local = {id(p): g.to_local() for p, g in pending}
    groups: dict[tuple, list[nn.Parameter]] = defaultdict(list)
    for p, g in pending:
        for dim, pl in enumerate(g.placements):
            if isinstance(pl, Partial) and pl.reduce_op in _OPS:
                key = (id(g.device_mesh), dim, pl.reduce_op, local[id(p)].dtype)
                groups[key].append(p)
    meshes = {id(g.device_mesh): g.device_mesh for _, g in pending}
    for (mesh_id, dim, op, _), members in groups.items():
        tensors = [local[id(p)] for p in members]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=_OPS[op], group=meshes[mesh_id].get_group(dim))
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    for p, g in pending:
        placements = [
            Replicate() if isinstance(pl, Partial) and pl.reduce_op in _OPS else pl
            for pl in g.placements
        ]
        p.grad = DTensor.from_local(
            local[id(p)], g.device_mesh, placements, shape=g.shape, stride=g.stride()
        )
    return len(groups)
