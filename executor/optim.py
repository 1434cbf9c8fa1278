"""Optimizers for a parallelized model: one per model chunk (torchtitan's container), so
each optimizer's parameters belong to one module and checkpoints name states by parameter."""

from __future__ import annotations

import torch
from torch import nn

from .compose import ParallelModel


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer (``adamw``, ``sgd`` or ``adafactor``) over `params`."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    raise ValueError(f"optimizer {name!r} is not supported; use adamw, sgd or adafactor")


class Optimizers:
    """The plan's optimizer over each of this rank's model chunks."""

    def __init__(self, pm: ParallelModel, *, lr: float, name: str | None = None) -> None:
        kind = name or pm.plan.train.optimizer
        self.optimizers = [make_optimizer(kind, list(p.parameters()), lr=lr) for p in pm.parts]

    def zero_grad(self) -> None:
        """Drop the gradients."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One update of every chunk."""
        for opt in self.optimizers:
            opt.step()
