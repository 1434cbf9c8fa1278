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


FSDP_UNITS = 4
"""Linear units of the FSDP2 host-cost benchmark (the slope from 1 to this many)."""
FSDP_WIDTH = 16
"""Width of each benchmark unit (a width x width Linear with bias)."""
FSDP_UNIT_BYTES = 4.0 * (FSDP_WIDTH * FSDP_WIDTH + FSDP_WIDTH)
"""Unsharded fp32 bytes of one benchmark unit's parameters."""


def fsdp_unit_s(timer: Timer, width: int = FSDP_WIDTH) -> float:
    """Seconds one FSDP2 unit adds to a forward+backward on the ranks' mesh: the slope of a
    stack of `fully_shard` Linear units from 1 to `FSDP_UNITS` (mean of repeats, as a step
    sums them). It holds the unit's three collectives (two all-gathers, one reduce-scatter)
    and its host work (pre/post hooks, copy-in and copy-out, the gradient division): the
    caller subtracts the collectives as the cost model prices them."""
    from torch.distributed.fsdp import fully_shard

    dev = timer.device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    x = torch.randn(4, width, device=dev)
    times = []
    for units in (1, FSDP_UNITS):
        stack = nn.Sequential(*(nn.Linear(width, width, device=dev) for _ in range(units)))
        for layer in stack:
            fully_shard(layer, mesh=mesh)
        fully_shard(stack, mesh=mesh)

        def step(stack: nn.Module = stack) -> None:
            stack(x).sum().backward()

        times.append(timer(step, mean=True))
    return max(0.0, (times[1] - times[0]) / (FSDP_UNITS - 1))


ADAMW_TENSORS = 16
"""Parameter tensors of the DTensor optimizer benchmark."""


def dtensor_adamw_tensor_s(timer: Timer, numel: int = 256) -> float:
    """Seconds an AdamW step (torch's single-tensor loop, the CPU default) spends per
    parameter tensor beyond a plain tensor's when the parameters are DTensors (FSDP2's
    `Shard(0)` shards; TP's are alike): every operator of the update runs DTensor's dispatch
    first. Measured as the difference of two steps over `ADAMW_TENSORS` tensors of `numel`
    local elements, DTensor against plain, so the kernels cancel."""
    dev = timer.device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))

    def params(dtensor: bool) -> list[nn.Parameter]:
        out = []
        for _ in range(ADAMW_TENSORS):
            local = torch.randn(numel, device=dev)
            value = DTensor.from_local(local, mesh, [Shard(0)]) if dtensor else local
            p = nn.Parameter(value)
            p.grad = torch.ones_like(p)
            out.append(p)
        return out

    seconds = []
    for dtensor in (False, True):
        opt = torch.optim.AdamW(params(dtensor), lr=1e-3, foreach=False)
        seconds.append(timer(opt.step))
    return max(0.0, (seconds[1] - seconds[0]) / ADAMW_TENSORS)
