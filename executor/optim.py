"""Optimizers for a parallelized model: one per model chunk (torchtitan's container), so
each optimizer's parameters belong to one module and checkpoints name states by parameter.

ZeRO-1 (optimizer states sharded over the data-parallel ranks, gradients all-reduced;
Rajbhandari et al. 2020, stage 1): each data-parallel rank keeps the states of, and updates,
a part of the parameters, then the updated parameters are broadcast from their owners.
- beside DDP (no TP, no PP): torch's `ZeroRedundancyOptimizer`;
- beside FSDP2's `replicate` (with TP and/or PP, where the parameters are DTensors, which
  `ZeroRedundancyOptimizer` cannot broadcast): `ShardedStates` below, the same algorithm
  over each parameter's local tensor (this rank's TP shard), whole parameters assigned to
  the ranks greedily by size (as `ZeroRedundancyOptimizer` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from .compose import ParallelModel
from .data_parallel import DataParallelKind, data_parallel_kind
from .partial_grads import reduce_partial_grads

OPTIMIZER_CLASSES: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.0}),
    "sgd": (torch.optim.SGD, {}),
    "adafactor": (torch.optim.Adafactor, {}),
}
"""Plan optimizer name -> torch class and its fixed keyword arguments."""


def _optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if name not in OPTIMIZER_CLASSES:
        raise ValueError(f"optimizer {name!r} is not supported; use adamw, sgd or adafactor")
    return OPTIMIZER_CLASSES[name]


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer (``adamw``, ``sgd`` or ``adafactor``) over `params`."""
    cls, kwargs = _optimizer_class(name)
    return cls(params, lr=lr, **kwargs)  # type: ignore[call-arg]  # every class takes lr


def _local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores for `p` (its shard of a DTensor), sharing storage."""
    return p.to_local() if isinstance(p, DTensor) else p


def assign_owners(sizes: list[int], ranks: int) -> list[int]:
    """The owner rank of each parameter (by element count): largest first, each to the least
    loaded rank (ties to the lower rank), as `ZeroRedundancyOptimizer` partitions."""
    loads, owners = [0] * ranks, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(ranks), key=lambda r: (loads[r], r))
        owners[i] = owner
        loads[owner] += sizes[i]
    return owners


class ShardedStates(torch.optim.Optimizer):
    """ZeRO-1 over DTensor parameters: this data-parallel rank's optimizer holds the states
    of the parameters it owns and updates them; `step` then broadcasts every parameter's
    local tensor from its owner over `group` (the ranks of one group hold the same tensors).
    `zero_grad` drops every gradient; `state` holds only the owned parameters' states."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        optimizer_class: type[torch.optim.Optimizer],
        group: dist.ProcessGroup,
        lr: float,
        **kwargs: Any,
    ) -> None:
        every = list(params)
        super().__init__(every, defaults={"lr": lr})
        self.group = group
        self.owners = assign_owners([_local(p).numel() for p in every], dist.get_world_size(group))
        mine = dist.get_rank(group)
        owned = [p for p, o in zip(every, self.owners, strict=True) if o == mine]
        self.inner: torch.optim.Optimizer | None = (
            optimizer_class(owned, lr=lr, **kwargs) if owned else None  # type: ignore[call-arg]
        )
        if self.inner is not None:
            self.state = self.inner.state  # the owned parameters' states, for inspection

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        """Update the owned parameters at this optimizer's learning rate, then broadcast each
        parameter from its owner. At learning rate 0 no parameter changes and nothing is
        sent: torch.distributed.checkpoint initializes empty states by such a step, on the
        ranks whose states are empty only."""
        if closure is not None:
            raise ValueError("ShardedStates.step takes no closure; call it without one")
        lr = self.param_groups[0]["lr"]
        if self.inner is not None:
            for group in self.inner.param_groups:
                group["lr"] = lr
            self.inner.step()
        if float(lr) == 0.0:
            return
        every = [p for g in self.param_groups for p in g["params"]]
        for p, owner in zip(every, self.owners, strict=True):
            dist.broadcast(_local(p), group=self.group, group_src=owner)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as any optimizer, keeping the owned states the ones the update reads."""
        super().load_state_dict(state_dict)
        if self.inner is not None:
            self.inner.state = self.state


def is_zero1(pm: ParallelModel) -> bool:
    """Whether the plan's optimizer states are sharded (ZeRO-1 beside DDP or `replicate`)."""
    kind = data_parallel_kind(pm.plan)
    return pm.plan.parallelism.zero_stage == 1 and kind in (
        DataParallelKind.DDP,
        DataParallelKind.REPLICATE,
    )


class Optimizers:
    """The plan's optimizer over each of this rank's model chunks."""

    def __init__(self, pm: ParallelModel, *, lr: float, name: str | None = None) -> None:
        cls, kwargs = _optimizer_class(name or str(pm.plan.train.optimizer))
        group = pm.dp_mesh.get_group() if is_zero1(pm) else None
        self.optimizers: list[torch.optim.Optimizer] = []
        for part in pm.parts:
            params = list(part.parameters())
            if group is None:
                opt: torch.optim.Optimizer = cls(params, lr=lr, **kwargs)  # type: ignore[call-arg]
            elif data_parallel_kind(pm.plan) == DataParallelKind.DDP:
                opt = ZeroRedundancyOptimizer(
                    params, optimizer_class=cls, process_group=group, lr=lr, **kwargs
                )
            else:
                opt = ShardedStates(params, optimizer_class=cls, group=group, lr=lr, **kwargs)
            self.optimizers.append(opt)

    def zero_grad(self) -> None:
        """Drop the gradients."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One update of every chunk, its pending (Partial) gradients reduced first, once
        (`partial_grads.py`)."""
        for opt in self.optimizers:
            reduce_partial_grads(p for g in opt.param_groups for p in g["params"])
            opt.step()
