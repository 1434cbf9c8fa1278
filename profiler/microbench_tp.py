"""Tensor parallelism's host cost on the ranks' mesh (`paraplan calibrate`, more than one
rank): DTensor operators cost sharding propagation in Python on top of their kernel."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..planner.calibration import TensorParallelDispatch
from .microbench import CHAIN_OPS, Timer


def tensor_parallel_dispatch(timer: Timer) -> TensorParallelDispatch:
    """DTensor's host cost on the default group as a 1-D mesh: seconds per operator on a
    DTensor (a chain of multiplies, forward and backward, as `dispatch_s`), and how many
    DTensor operators the wrapped modules paraplan's executor uses dispatch (counted by a
    dispatch mode over a tiny module's forward and backward)."""
    dev = timer.device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    w = torch.ones(8, 8, device=dev, requires_grad=True)

    def chain() -> None:
        y: torch.Tensor = DTensor.from_local(w, mesh, [Shard(0)])
        for _ in range(CHAIN_OPS):
            y = y * 1.0
        assert isinstance(y, DTensor)
        y.to_local().sum().backward()

    launch_s = timer(chain) / (2 * CHAIN_OPS)
    h, world = 8 * dist.get_world_size(), dist.get_world_size()
    local = (2, 4, h)
    col = _dtensor_ops(nn.Linear(h, h, device=dev), ColwiseParallel(), mesh, local)
    row = _dtensor_ops(nn.Linear(h, h, device=dev), RowwiseParallel(), mesh, (2, 4, h // world))
    norm = _dtensor_ops(nn.LayerNorm(h, device=dev), SequenceParallel(), mesh, local)
    return TensorParallelDispatch(
        launch_s=launch_s, colwise_ops=col, rowwise_ops=row, sequence_norm_ops=norm
    )


class _DTensorOps(TorchDispatchMode):
    """Counts operators that reach the dispatcher with a DTensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(isinstance(t, DTensor) for t in tree_leaves((args, kwargs))):
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _dtensor_ops(
    module: nn.Module, style: ParallelStyle, mesh: DeviceMesh, shape: tuple[int, ...]
) -> tuple[int, int]:
    """(forward, backward) DTensor operators of `module` wrapped in `style`."""
    parallelize_module(module, mesh, style)
    x = torch.randn(shape, device=mesh.device_type, requires_grad=True)
    forward = _DTensorOps()
    with forward:
        y = module(x)
    local = y.to_local() if isinstance(y, DTensor) else y
    backward = _DTensorOps()
    with backward:
        local.sum().backward()
    return forward.ops, backward.ops
