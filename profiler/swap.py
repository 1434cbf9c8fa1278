"""A model's parameters and buffers replaced for the duration of a block (fake tensors for
tracing), each shared tensor once, restored afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def swapped_tensors(
    model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """Every parameter and buffer of `model` as `make(t)` (a parameter stays a parameter with
    its `requires_grad`; a tensor shared by several modules maps to one replacement)."""
    originals: list[tuple[dict, str, Any]] = []
    memo: dict[int, Any] = {}
    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for key, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in memo:
                    new = make(t)
                    is_param = isinstance(t, nn.Parameter)
                    memo[id(t)] = nn.Parameter(new, t.requires_grad) if is_param else new
                originals.append((table, key, t))
                table[key] = memo[id(t)]
    try:
        yield
    finally:
        for table, key, t in originals:
            table[key] = t
