"""Pipeline parallelism: the plan's layer ranges as `torch.distributed.pipelining` stages.

Chunk c of the plan (chain layers first_layer..last_layer) runs on pipeline rank c % pp
(Narayanan et al. 2021 §2.2); a rank holds `virtual_stages` chunks under interleaved 1F1B.
ZB-V and DualPipeV place their two chunks per rank in a V (chunk c on rank c for c < pp, else
2 pp - 1 - c: torch's `generate_stage_to_rank_mapping(style="v")`, which their schedule
classes set on the stages), so rank 0 runs both the embedding and the head.
The schedule splits each local batch into the plan's micro-batches and averages their losses
(`scale_grads=True`), so gradients equal those of the whole batch.

A head that shares the embedding matrix (GPT-2) gets its own copy under a pipeline; after
backward the copies' gradients are summed over the ranks that hold them (Megatron-LM's
embedding group), or on rank 0 itself in a V, so both copies see the tied gradient and stay
equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor

from ..planner.cost.layout import chunk_stage
from ..planner.plan import Plan
from ..planner.solvers.pipeline_replay import V_SHAPED
from ..planner.strategy import MeshAxis, Schedule
from .chain import ChainModule

SCHEDULES = {
    Schedule.GPIPE: ScheduleGPipe,
    Schedule.ONE_F_ONE_B: Schedule1F1B,
    Schedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B,
    Schedule.INTERLEAVED_ZB: ScheduleInterleavedZeroBubble,
    Schedule.ZBV: ScheduleZBVZeroBubble,
    Schedule.DUALPIPEV: ScheduleDualPipeV,
}
"""The plan's schedules this executor runs (ZB-V and DualPipeV with their chunks in a V)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TiedCopies:
    """The two copies of a matrix the embedding and head share, split over pipeline ranks."""

    holders: tuple[tuple[nn.Module, str], ...]
    """(chunk, parameter name) of the copies this rank holds (none on a middle rank);
    looked up at each use because FSDP replaces parameters when it shards them."""
    group: dist.ProcessGroup | None
    """The ranks holding a copy, with this rank in it (None on a middle rank, and in a V,
    where rank 0 holds both copies)."""

    def sync_grads(self) -> None:
        """Sum the copies' gradients over the group (or on this rank when it holds both), so
        each holds the tied gradient."""
        if self.group is None:
            if len(self.holders) == 2:  # a V: both copies here
                grads = [g for g in map(self._local_grad, self.holders) if g is not None]
                if len(grads) == 2:
                    total = grads[0] + grads[1]
                    for g in grads:
                        g.copy_(total)
            return
        for holder in self.holders:
            grad = self._local_grad(holder)
            if grad is not None:
                dist.all_reduce(grad, group=self.group)

    @staticmethod
    def _local_grad(holder: tuple[nn.Module, str]) -> torch.Tensor | None:
        """The copy's gradient as a local tensor, in the layout of its parameter."""
        part, name = holder
        p = part.get_parameter(name)
        if p.grad is None:
            return None
        # a vocab-parallel embedding's gradient may come back with other placements than its
        # Shard(0) table (the head's): the same layout on both copies first
        if (
            isinstance(p.grad, DTensor)
            and isinstance(p, DTensor)
            and p.grad.placements != p.placements
        ):
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        return p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad


def local_chunks(plan: Plan, pp_rank: int) -> list[tuple[int, int, int]]:
    """(chunk index, first layer, last layer) of the chunks pipeline rank `pp_rank` runs."""
    for stage in plan.stages:
        if stage.stage == pp_rank:
            return [(c.chunk, c.first_layer, c.last_layer) for c in stage.chunks]
    raise ValueError(
        f"the plan has no layer ranges for pipeline rank {pp_rank} (stages "
        f"{[s.stage for s in plan.stages]}); re-plan: every rank needs a stage"
    )


def check_layout(plan: Plan, num_blocks: int) -> None:
    """Chunks must cover chain layers 0..L+1 once, in order, placed in a loop over the ranks
    (in a V for ZB-V and DualPipeV)."""
    pp = plan.parallelism.pp
    v_shaped = plan.schedule in V_SHAPED
    chunks = sorted(
        (c.chunk, c.first_layer, c.last_layer, s.stage) for s in plan.stages for c in s.chunks
    )
    expected = pp * plan.parallelism.virtual_stages
    nxt = 0
    for i, (index, first, last, stage) in enumerate(chunks):
        if index != i or first != nxt or last < first or stage != chunk_stage(i, pp, v_shaped):
            where = "in a V (c, or 2 pp - 1 - c past pp)" if v_shaped else f"chunk % {pp}"
            raise ValueError(
                f"pipeline chunk {index} ({first}..{last} on rank {stage}) breaks the layout: "
                f"chunks must be numbered 0..{expected - 1}, run on rank {where}, and "
                f"cover the chain 0..{num_blocks + 1} in order; re-plan for this model"
            )
        nxt = last + 1
    if len(chunks) != expected or nxt != num_blocks + 2:
        raise ValueError(
            f"the plan has {len(chunks)} pipeline chunks covering layers 0..{nxt - 1}; "
            f"expected {expected} covering 0..{num_blocks + 1}; re-plan for this model"
        )


def untie(chain: ChainModule) -> None:
    """Give the head its own copy of a matrix it shares with the embedding."""
    if chain.tied is None or chain.head is None:
        return
    head_name = chain.tied[1].removeprefix("head.")
    module_path, _, leaf = head_name.rpartition(".")
    owner = chain.head.get_submodule(module_path)
    shared = getattr(owner, leaf)
    setattr(owner, leaf, nn.Parameter(shared.detach().clone(), shared.requires_grad))


def tied_copies(
    chain: ChainModule, parts: list[ChainModule], mesh: DeviceMesh, v_shaped: bool = False
) -> TiedCopies:
    """The tied copies on this rank and the group of ranks (first and last pipeline rank at
    the same dp/cp/tp coordinates) that sums their gradients (none in a V: rank 0 holds both
    copies)."""
    if chain.tied is None:
        return TiedCopies(holders=(), group=None)
    holders = [(part, chain.tied[0]) for part in parts if part.embed is not None]
    holders += [(part, chain.tied[1]) for part in parts if part.head is not None]
    if v_shaped:
        return TiedCopies(holders=tuple(holders), group=None)
    names = mesh.mesh_dim_names or ()
    pp_axis = names.index(str(MeshAxis.PP))
    pp = mesh.size(pp_axis)
    rows = mesh.mesh.movedim(pp_axis, -1).reshape(-1, pp)  # (other coordinates, pp)
    me, group = dist.get_rank(), None
    if pp == 2:  # the pipeline group is the pair
        group = mesh.get_group(pp_axis)
    else:  # every rank creates every pair's group, in the same order
        for row in rows.tolist():
            pair = [row[0], row[-1]]
            g = dist.new_group(pair)
            if me in pair:
                group = g
    return TiedCopies(holders=tuple(holders), group=group)


def release(chain: ChainModule, kept: list[ChainModule]) -> None:
    """Free the layers other ranks run: their parameters move to the meta device (the caller's
    model keeps its structure, without storage for them)."""
    mine = {id(m) for part in kept for m in part.modules()}
    for module in (chain.embed, *chain.blocks.values(), chain.head):
        if module is not None and id(module) not in mine:
            module.to("meta")


def split(
    chain: ChainModule, plan: Plan, mesh: DeviceMesh, device: torch.device
) -> tuple[list[tuple[int, ChainModule]], TiedCopies]:
    """This rank's (chunk index, chunk) pairs on `device`, and the tied embedding/head copies
    (the whole chain and no copies without a pipeline)."""
    if plan.parallelism.pp == 1:
        return [(0, chain.to(device))], TiedCopies(holders=(), group=None)
    untie(chain)
    ranges = local_chunks(plan, mesh.get_local_rank(str(MeshAxis.PP)))
    chunks = [(index, chain.chunk(first, last)) for index, first, last in ranges]
    release(chain, [c for _, c in chunks])
    for _, part in chunks:
        part.to(device)
    kept = [c for _, c in chunks]
    return chunks, tied_copies(chain, kept, mesh, plan.schedule in V_SHAPED)


def build_schedule(
    plan: Plan,
    modules: list[tuple[int, nn.Module]],
    pp_mesh: DeviceMesh,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    """Stages for this rank's (chunk index, module) pairs and the plan's schedule."""
    num_chunks = plan.parallelism.pp * plan.parallelism.virtual_stages
    group = pp_mesh.get_group()
    stages: list[Any] = [
        PipelineStage(module, index, num_chunks, device, group=group) for index, module in modules
    ]
    kind = SCHEDULES[plan.schedule]
    n = plan.num_microbatches
    if kind in (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble):
        if n % plan.parallelism.pp:
            raise ValueError(
                f"{plan.schedule} needs the micro-batch count ({n}) to be a multiple of "
                f"pp={plan.parallelism.pp}; re-plan with another micro-batch size"
            )
        return kind(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
    if kind in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
        # the V's two stages of this rank; the schedule sets their V rank mapping itself
        if len(stages) != 2:
            raise ValueError(
                f"{plan.schedule} runs two chunks per rank in a V, this rank has {len(stages)}; "
                "re-plan with virtual_stages=2"
            )
        if kind is ScheduleDualPipeV and n < num_chunks:
            raise ValueError(
                f"dualpipev needs at least 2*pp={num_chunks} micro-batches, not {n}; re-plan "
                "with a smaller micro-batch size or a larger batch"
            )
        return kind(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
    if len(stages) != 1:
        raise ValueError(f"{plan.schedule} runs one chunk per rank, this rank has {len(stages)}")
    return kind(stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
