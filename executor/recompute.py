"""Per-layer activation checkpointing, from the plan's `recompute` decisions.

``full`` recomputes the whole block in backward (only its input is kept); ``selective``
recomputes the attention core only: the scaled-dot-product-attention kernels and softmax
(Korthikanti et al. 2022 §5); under context parallelism the ring's per-block scores, softmax
and merge, and its K/V exchange (`P2P_NAMESPACE`). Everything else is saved, through selective
activation checkpointing (`create_selective_checkpoint_contexts`). Both use the composable
`torch.distributed._composable.checkpoint`, which keeps parameter names unchanged (so
checkpoints and FSDP wrapping do not see an extra module level).
"""

from __future__ import annotations

import functools

import torch
from torch.distributed._composable import checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..planner.plan import Plan
from ..planner.strategy import Recompute
from .chain import ChainModule
from .context_parallel import in_ring_core

_aten = torch.ops.aten
ATTENTION_CORE_OPS = frozenset(
    op
    for op in (
        getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None),
        getattr(_aten, "_scaled_dot_product_flash_attention", None),
        getattr(_aten, "_scaled_dot_product_efficient_attention", None),
        getattr(_aten, "_scaled_dot_product_cudnn_attention", None),
        _aten._softmax,
    )
    if op is not None
)
"""Op packets (all overloads) whose outputs selective recompute drops."""


P2P_NAMESPACE = "c10d"
"""Namespace of the point-to-point ops (``c10d.send``, ``c10d.recv_``) of the context-parallel
ring: selective recompute re-runs them. Cached instead, the replay returns the forward's
finished send but the receive waits for a message no peer sends again: a hang (torch 2.13,
gloo; a 2-rank ring under `create_selective_checkpoint_contexts` reproduces it). Re-run, the
ring exchanges its K/V blocks again in backward on every CP rank in the same order, as under
full recompute."""


def _selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> object:
    if getattr(op, "overloadpacket", op) in ATTENTION_CORE_OPS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    if getattr(op, "namespace", None) == P2P_NAMESPACE or in_ring_core():
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def layer_recompute(plan: Plan) -> dict[int, Recompute]:
    """ChainModule index -> recompute policy, from the plan's per-layer decisions."""
    return {d.index: d.recompute for d in plan.layers}


def apply_recompute(chain: ChainModule, decisions: dict[int, Recompute]) -> int:
    """Checkpoint each block of `chain` as `decisions` says (block key k is chain index
    k + 1); returns how many blocks recompute. The embedding and head never do."""
    count = 0
    for key, block in chain.blocks.items():
        policy = decisions.get(int(key) + 1, Recompute.NONE)
        if policy == Recompute.FULL:
            checkpoint(block)
        elif policy == Recompute.SELECTIVE:
            context = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
            checkpoint(block, context_fn=context)
        else:
            continue
        count += 1
    return count
