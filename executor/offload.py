"""Activation offload per block, from the plan's `offload_activations` layer decisions.

Each offloaded block runs its forward under `torch.autograd.graph.save_on_cpu`: every tensor
it saves for backward is copied to host memory when saved and back when the backward reads it
(vDNN, Rhu et al. 2016; the planner prices the PCIe copies in `planner/cost/offload.py`). On
CUDA the host copies are pinned; on a CPU device they stay where they are (the numerics are
the same, nothing is freed). Module hooks open the context before the block's forward and
close it after, outside any checkpoint the block carries (`recompute.py`), so a recomputed
block offloads what its checkpoint keeps: its input; the recomputation inside backward runs
without it (the checkpoint must see the tensors it saves again).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from ..planner.plan import Plan
from .chain import ChainModule


def layer_offload(plan: Plan) -> frozenset[int]:
    """Chain indices whose saved activations go to the host."""
    return frozenset(d.index for d in plan.layers if d.offload_activations)


class _SaveOnCpu:
    """Forward pre-hook and hook pair that holds one `save_on_cpu` context per forward."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self.open: list[Any] = []

    def enter(self, module: nn.Module, args: Any) -> None:
        ctx: Any = contextlib.nullcontext()
        if torch._C._current_graph_task_id() == -1:  # not a checkpoint's recompute in backward
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory)
        ctx.__enter__()
        self.open.append(ctx)

    def exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self.open.pop().__exit__(None, None, None)


def apply_activation_offload(chain: ChainModule, layers: frozenset[int]) -> int:
    """Offload the saved activations of `chain`'s blocks whose chain index (block key k is
    index k + 1) is in `layers`; returns how many blocks offload."""
    count = 0
    for key, block in chain.blocks.items():
        if int(key) + 1 not in layers:
            continue
        device = next((p.device for p in block.parameters()), torch.device("cpu"))
        hooks = _SaveOnCpu(pin_memory=device.type == "cuda")
        # first to open (before a checkpoint's pre-hook), last to close (after its hook)
        block.register_forward_pre_hook(hooks.enter, prepend=True)
        block.register_forward_hook(hooks.exit, always_call=True)
        count += 1
    return count
