"""Training steps under a plan: optimizers per model chunk, one step, the reported loss."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..planner.strategy import MeshAxis
from . import mesh as meshes
from .compose import ParallelModel


def global_loss(pm: ParallelModel, loss: torch.Tensor | None) -> float:
    """The step's loss over the global batch, on every rank: the mean of the data-parallel
    replicas' losses (held by the last pipeline stage, the same on each TP rank). One
    all-reduce over the world."""
    held = loss.detach().float() if loss is not None else torch.zeros((), device=pm.device)
    total = held.reshape(1).clone()
    dist.all_reduce(total)
    holders = meshes.axis_size(pm.mesh, MeshAxis.DP) * meshes.axis_size(pm.mesh, MeshAxis.TP)
    return total.item() / holders


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer (``adamw``, ``sgd`` or ``adafactor``) over `params`."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    raise ValueError(f"optimizer {name!r} is not supported; use adamw, sgd or adafactor")
