"""Data parallelism: FSDP2 `fully_shard` (ZeRO-2/3) or DDP (ZeRO-0), with mixed precision and
optimizer offload.

ZeRO stages map onto torch as follows (Rajbhandari et al. 2020 define the stages):
- 3: `fully_shard` (parameters, gradients and optimizer states sharded; parameters
  re-gathered for backward);
- 2: `fully_shard(reshard_after_forward=False)` (parameters stay gathered between forward
  and backward, gradients and states sharded);
- 1: run as ZeRO-2. FSDP2 has no mode that shards optimizer states only, so a ZeRO-1 plan
  also shards gradients: less memory than planned, the same communication volume
  (reduce-scatter + all-gather instead of all-reduce);
- 0: `DistributedDataParallel` (replicated, gradients all-reduced in buckets).
Optimizer offload is FSDP2's `CPUOffloadPolicy`: sharded parameters, gradients and the
optimizer step live on the host (pin_memory only with CUDA; on CPU it fails otherwise).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.nn.parallel import DistributedDataParallel

from .chain import Chain

PARAM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
"""Compute dtype of each plan precision (None: fp32 throughout)."""


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 master weights and fp32 gradient reduction (torchtitan's
    default); fp32 runs with the default policy."""
    dtype = PARAM_DTYPES[precision]
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(
    chain: Chain,
    dp_mesh: DeviceMesh,
    *,
    zero_stage: int,
    precision: str,
    offload: bool,
) -> None:
    """`fully_shard` each block, then the chain (its embedding and head: a tied matrix stays
    in one unit), in place."""
    device_type = dp_mesh.device_type
    kwargs = {
        "mesh": dp_mesh,
        "reshard_after_forward": zero_stage >= 3,
        "mp_policy": mixed_precision(precision),
        "offload_policy": (
            CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload else OffloadPolicy()
        ),
    }
    for block in chain.blocks.values():
        fully_shard(block, **kwargs)
    fully_shard(chain, **kwargs)


def apply_ddp(module: nn.Module, dp_mesh: DeviceMesh) -> DistributedDataParallel:
    """Wrap in DDP over the ``dp`` axis (gradients averaged in buckets during backward)."""
    device_ids = [torch.cuda.current_device()] if dp_mesh.device_type == "cuda" else None
    return DistributedDataParallel(
        module, process_group=dp_mesh.get_group(), device_ids=device_ids
    )
