"""Optimizers for a parallelized model: one per model chunk (torchtitan's container), so
each optimizer's parameters belong to one module and checkpoints name states by parameter.

ZeRO-1 (states sharded, gradients all-reduced by DDP) is torch's `ZeroRedundancyOptimizer`:
each data-parallel rank keeps the states of and updates a part of the parameters, then
broadcasts them (Rajbhandari et al. 2020, stage 1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from .compose import ParallelModel
from .data_parallel import DataParallelKind, data_parallel_kind

OPTIMIZER_CLASSES: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.0}),
    "sgd": (torch.optim.SGD, {}),
    "adafactor": (torch.optim.Adafactor, {}),
}
"""Plan optimizer name -> torch class and its fixed keyword arguments."""


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer (``adamw``, ``sgd`` or ``adafactor``) over `params`."""
    if name not in OPTIMIZER_CLASSES:
        raise ValueError(f"optimizer {name!r} is not supported; use adamw, sgd or adafactor")
    cls, kwargs = OPTIMIZER_CLASSES[name]
    return cls(params, lr=lr, **kwargs)  # type: ignore[call-arg]  # every class takes lr


def is_zero1(pm: ParallelModel) -> bool:
    """Whether the plan's optimizer states are sharded beside DDP (ZeRO-1)."""
    par = pm.plan.parallelism
    return par.zero_stage == 1 and data_parallel_kind(pm.plan) == DataParallelKind.DDP


class Optimizers:
    """The plan's optimizer over each of this rank's model chunks."""

    def __init__(self, pm: ParallelModel, *, lr: float, name: str | None = None) -> None:
        kind = name or str(pm.plan.train.optimizer)
        if is_zero1(pm):
            if kind not in OPTIMIZER_CLASSES:
                raise ValueError(
                    f"optimizer {kind!r} is not supported; use adamw, sgd or adafactor"
                )
            cls, kwargs = OPTIMIZER_CLASSES[kind]
            group = pm.dp_mesh.get_group()
            self.optimizers: list[torch.optim.Optimizer] = [
                ZeroRedundancyOptimizer(
                    list(p.parameters()), optimizer_class=cls, process_group=group, lr=lr, **kwargs
                )
                for p in pm.parts
            ]
        else:
            self.optimizers = [make_optimizer(kind, list(p.parameters()), lr=lr) for p in pm.parts]

    def zero_grad(self) -> None:
        """Drop the gradients."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One update of every chunk."""
        for opt in self.optimizers:
            opt.step()
