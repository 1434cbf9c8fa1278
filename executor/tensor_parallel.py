"""Tensor parallelism (with or without sequence parallelism) on a chain's blocks.

Each block gets its model's plan (`ChainModule.tp_plan`, or one the caller gives) through DTensor
`parallelize_module` on the ``tp`` mesh axis. The embedding and output matrices are split over
the vocabulary (Megatron-LM's vocab-parallel embedding; torchtitan's plan), as the cost model
prices them: the embedding by rows (each rank looks up its vocabulary range, partial results
all-reduced), the head by columns, its logits left sharded on the vocabulary dim (B, T, V/tp)
for the loss, which torch's `loss_parallel` computes without gathering them (`ParallelModel`
runs the loss and its backward under it). A matrix
the embedding and head share (GPT-2's) is one parameter, sharded the same way (Shard(0)) for
both. Under sequence parallelism the embedding output is cut into sequence shards
(B, T/tp, H) for the first block, and the head gathers them back. Chains without
`ChainModule.vocab`, pipelined plans and custom losses keep the embedding and head whole on
every TP rank (with a pipeline, the stage boundaries' send/recv broke on the sharded tied
copies: gloo "received data size doesn't match", torch 2.13).
"""

from __future__ import annotations

from typing import Any, cast

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
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
    shard_logits: bool = True,
) -> None:
    """Shard `chain`'s blocks over `tp_mesh` in place (a pipeline chunk: only its parts); with
    `shard_logits`, also the embedding and head over the vocabulary (the logits stay sharded
    for `loss_parallel`), else they stay whole on every rank (a pipeline, or a loss that needs
    whole logits)."""
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
    if shard_logits:  # not under a pipeline (its stages' p2p shapes do not follow)
        apply_vocab_parallel(chain, tp_mesh)
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


def apply_vocab_parallel(chain: ChainModule, tp_mesh: DeviceMesh) -> None:
    """Split the embedding table by vocabulary rows and the output projection by vocabulary
    columns (in place); a tied matrix stays one parameter."""
    if chain.vocab is None:
        return
    table = head_weight = None
    if chain.embed is not None:  # (B, T) ids -> (B, T, H), replicated (partial sums reduced)
        parallelize_module(
            chain.embed,
            tp_mesh,
            {chain.vocab.embedding: RowwiseParallel(input_layouts=Replicate())},
        )
        table = chain.embed.get_submodule(chain.vocab.embedding)
    if chain.head is not None:  # (B, T, H) -> logits (B, T, V/tp), a DTensor
        style = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        parallelize_module(chain.head, tp_mesh, {chain.vocab.projection: style})
        head_weight = chain.head.get_submodule(chain.vocab.projection)
    if chain.tied is not None and table is not None and head_weight is not None:
        head_weight.weight = table.weight  # both Shard(0) over tp: one parameter again
