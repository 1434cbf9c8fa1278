"""Data parallelism: FSDP2 `fully_shard` (ZeRO-2/3, HSDP) or DDP (ZeRO-0/1), with mixed
precision and optimizer offload.

ZeRO stages map onto torch as follows (Rajbhandari et al. 2020 define the stages):
- 3: `fully_shard` (parameters, gradients and optimizer states sharded; each block's
  parameters re-gathered for backward; the root's, i.e. embedding and head, kept gathered from
  forward to backward, torch's default since backward starts with them). HSDP (plan
  `dp_shard` < dp): `fully_shard` on a 2-D (replicate, shard) mesh made from the dp axis,
  shards within groups of dp_shard consecutive dp ranks, replicas across the groups;
- 2: `fully_shard(reshard_after_forward=False)` (parameters stay gathered between forward
  and backward, gradients and states sharded);
- 1: ZeRO-0's data parallelism (below) and sharded optimizer states (updated parameters
  broadcast from their owners): torch's `ZeroRedundancyOptimizer` beside DDP, `optim.py`'s
  `ShardedStates` beside `replicate` (TP, PP). The capability table keeps it from EP;
- 0: `DistributedDataParallel` (replicated, gradients all-reduced in buckets); with tensor
  or pipeline parallelism, FSDP2's `replicate` instead (the same algorithm), because DDP
  cannot broadcast DTensor parameters ("got mixed torch.Tensor and DTensor") and its reducer
  fails when a pipeline schedule runs several backward passes per step ("rebuilt parameter
  indices size is not same as original model parameters size"; both seen on torch 2.13).
The data-parallel group includes the context-parallel ranks (they hold other tokens of the
same sequences, so their gradients are averaged like the replicas'; the planner prices ZeRO
over dp x cp). Expert parameters sharded by expert parallelism are left out
(`expert_parallel.ExpertGrads` reduces them).
Optimizer offload is FSDP2's `CPUOffloadPolicy`: sharded parameters, gradients and the
optimizer step live on the host (pin_memory only with CUDA; on CPU it fails otherwise). The
plan's parameter offload (`offload_params`, ZeRO-3) is the same policy; a ZeRO-3 plan with
optimizer offload must carry it (the capability table refuses the optimizer offloaded alone,
DeepSpeed's choice, which FSDP2 has no policy for; the planner's runnable search prices ZeRO-3
optimizer offload with the parameters' copies).
PowerSGD (plan `powersgd_rank`; Vogels et al. 2019) is DDP's `powerSGD_hook` with error
feedback and warm start, torch's defaults otherwise (`start_powerSGD_iter` vanilla steps
first, `min_compression_rate` 2).
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.nn.parallel import DistributedDataParallel

from ..planner.config import Precision
from ..planner.cost.compression import MIN_COMPRESSION_RATE, POWERSGD_START_ITER
from ..planner.plan import Plan
from ..planner.strategy import MeshAxis
from .chain import ChainModule
from .mesh import flatten_axes, split_axis

PARAM_DTYPES: dict[Precision, torch.dtype | None] = {
    Precision.FP32: None,
    Precision.BF16: torch.bfloat16,
}
"""Compute dtype of each plan precision (None: fp32 throughout)."""


class DataParallelKind(StrEnum):
    """How the data-parallel axis is run."""

    NONE = "none"
    DDP = "ddp"
    REPLICATE = "replicate"
    FSDP = "fsdp"

    @property
    def autocasts(self) -> bool:
        """Whether mixed precision needs `torch.autocast` (no FSDP2 policy casts)."""
        return self in (DataParallelKind.NONE, DataParallelKind.DDP)


def data_parallel_kind(plan: Plan) -> DataParallelKind:
    """FSDP2 for ZeRO >= 2 or offload; DDP for ZeRO-0/1 without TP/PP, else `replicate`
    (ZeRO-1's sharded optimizer states are `optim.py`'s, beside either)."""
    par = plan.parallelism
    if plan.strategy().fsdp_wrapped:  # one rule with the planner's capabilities and prices
        return DataParallelKind.FSDP
    if par.dp * par.cp == 1:  # the data-parallel group (context-parallel ranks included)
        return DataParallelKind.NONE
    if par.tp == 1 and par.pp == 1:
        return DataParallelKind.DDP
    return DataParallelKind.REPLICATE


def data_parallel_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The mesh data parallelism runs over: the dp axis, times the cp axis under context
    parallelism (one axis), as (replicate, shard) under HSDP: shard groups of dp_shard
    consecutive dp ranks (x cp), replicas across them (torchtitan's dp_replicate x
    dp_shard_cp). A collective when it differs from the plan's dp axis (it creates groups)."""
    par = plan.parallelism
    dp, cp = str(MeshAxis.DP), str(MeshAxis.CP)
    if par.dp_shard == par.dp:
        return flatten_axes(mesh, (dp, cp) if par.cp > 1 else (dp,), "dp_cp")
    rep, shard = "dp_replicate", "dp_shard"
    full = split_axis(mesh, MeshAxis.DP, (par.dp // par.dp_shard, par.dp_shard), (rep, shard))
    if par.cp == 1:
        return full[(rep, shard)]
    flatten_axes(full, (shard, cp), "dp_shard_cp")
    return full[(rep, "dp_shard_cp")]


def apply_data_parallel(
    chain: ChainModule, dp_mesh: DeviceMesh, plan: Plan, *, ignored: set[nn.Parameter]
) -> nn.Module:
    """The plan's data parallelism on `chain` over `dp_mesh` (in place), leaving the `ignored`
    parameters alone; returns the module to run (a DDP wrapper, or `chain` itself)."""
    kind, par, precision = data_parallel_kind(plan), plan.parallelism, plan.train.precision
    if kind == DataParallelKind.FSDP:
        apply_fsdp(
            chain,
            dp_mesh,
            zero_stage=par.zero_stage,
            precision=precision,
            offload=par.offload_optimizer or par.offload_params,
            ignored=ignored,
        )
    elif kind == DataParallelKind.REPLICATE:
        apply_replicate(chain, dp_mesh, precision=precision)
    elif kind == DataParallelKind.DDP:
        ddp = apply_ddp(chain, dp_mesh, ignored=ignored)
        if par.powersgd_rank is not None:
            apply_powersgd(ddp, dp_mesh, rank=par.powersgd_rank)
        return ddp
    return chain


def mixed_precision(precision: Precision) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 master weights and fp32 gradient reduction (torchtitan's
    default); fp32 runs with the default policy."""
    dtype = PARAM_DTYPES[precision]
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(
    chain: ChainModule,
    dp_mesh: DeviceMesh,
    *,
    zero_stage: int,
    precision: Precision,
    offload: bool,
    ignored: set[nn.Parameter],
) -> None:
    """`fully_shard` each block, then the chain (its embedding and head: a tied matrix stays
    in one unit), in place; a 2-D `dp_mesh` (replicate, shard) is HSDP."""
    policy = mixed_precision(precision)
    # ZeRO-3: torch's default (None), which reshards every block after forward but not the
    # root (embedding, head), needed as soon as backward starts; ZeRO-2: nothing reshards.
    reshard = None if zero_stage >= 3 else False
    pin = dp_mesh.device_type == "cuda"
    offload_policy = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
    for module in (*chain.blocks.values(), chain):
        fully_shard(
            module,
            mesh=dp_mesh,
            reshard_after_forward=reshard,
            mp_policy=policy,
            offload_policy=offload_policy,
            ignored_params=ignored or None,
        )


def apply_ddp(
    module: nn.Module, dp_mesh: DeviceMesh, *, ignored: set[nn.Parameter]
) -> DistributedDataParallel:
    """Wrap in DDP over the ``dp`` axis (gradients averaged in buckets during backward)."""
    device_ids = [torch.cuda.current_device()] if dp_mesh.device_type == "cuda" else None
    if ignored:
        names = [n for n, p in module.named_parameters() if p in ignored]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
    # The gradients are views of DDP's buckets, not a second copy of them (torch's
    # DistributedDataParallel docs: saves memory equal to the gradients' size); the planner
    # prices it so (planner/cost/stages.py static memory, Evaluator.single_pass).
    return DistributedDataParallel(
        module,
        process_group=dp_mesh.get_group(),
        device_ids=device_ids,
        gradient_as_bucket_view=True,
    )


def apply_powersgd(
    ddp: DistributedDataParallel,
    dp_mesh: DeviceMesh,
    *,
    rank: int,
    start_iter: int = POWERSGD_START_ITER,
) -> powersgd.PowerSGDState:
    """Compress DDP's gradient all-reduce with PowerSGD at `rank` (error feedback and warm
    start on); the first `start_iter` steps all-reduce uncompressed (torch needs > 1)."""
    state = powersgd.PowerSGDState(
        process_group=dp_mesh.get_group(),
        matrix_approximation_rank=rank,
        start_powerSGD_iter=start_iter,
        min_compression_rate=MIN_COMPRESSION_RATE,
    )
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    return state


def apply_replicate(chain: ChainModule, dp_mesh: DeviceMesh, *, precision: Precision) -> None:
    """ZeRO-0 with TP or PP: FSDP2's `replicate` on each block, then the chain (chunk)."""
    policy = mixed_precision(precision)
    for block in chain.blocks.values():
        replicate(block, mesh=dp_mesh, mp_policy=policy)
    replicate(chain, mesh=dp_mesh, mp_policy=policy)
