"""Tensor parallelism (with or without sequence parallelism) on a chain's blocks.

Each block gets its model's plan (`ChainModule.tp_plan`, or one the caller gives) through DTensor
`parallelize_module` on the ``tp`` mesh axis. The embedding and the head stay whole on every
TP rank (they may share one matrix, and GPT-2's does): their inputs are identical across the
TP group, so their gradients are too. Under sequence parallelism the embedding output is cut
into sequence shards (B, T/tp, H) for the first block, and the head gathers them back.
"""

from __future__ import annotations

from typing import Any, cast

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    parallelize_module,
)

from .chain import ChainModule, TPPlanFn


def apply_tp(
    chain: ChainModule,
    tp_mesh: DeviceMesh,
    *,
    sequence_parallel: bool,
    heads: int,
    kv_heads: int,
    tp_plan: TPPlanFn | None = None,
) -> None:
    """Shard `chain`'s blocks over `tp_mesh` in place (a pipeline chunk: only its parts)."""
    tp = tp_mesh.size()
    plan_fn = tp_plan or chain.tp_plan
    if plan_fn is None:
        raise ValueError(
            f"tensor parallelism tp={tp} for a {chain.family!r} chain without a TP plan; pass "
            "tp_plan=lambda sequence_parallel: {'path.in.block': ColwiseParallel(), ...}"
        )
    if heads % tp or kv_heads % tp:
        raise ValueError(
            f"tp={tp} must divide the attention heads ({heads}) and key/value heads "
            f"({kv_heads}) so every rank holds whole heads; re-plan with a tp that divides both"
        )
    block_plan: dict[str, ParallelStyle] = plan_fn(sequence_parallel)
    for block in chain.blocks.values():
        parallelize_module(block, tp_mesh, block_plan)
        if sequence_parallel and hasattr(block, "seq_shards"):
            cast(Any, block).seq_shards = tp  # e.g. rotary embeddings need the whole length
    if not sequence_parallel:
        return
    if chain.embed is not None:  # (B, T, H) replicated -> (B, T/tp, H), a local slice
        parallelize_module(
            chain.embed,
            tp_mesh,
            PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True
            ),
        )
    if chain.head is not None:  # (B, T/tp, H) -> (B, T, H): all-gather over the sequence
        parallelize_module(
            chain.head,
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            ),
        )
