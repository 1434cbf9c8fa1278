"""What autograd keeps under `torch.autocast` over fp32 weights, per chain segment.

The executor autocasts where it trains fp32 master weights without FSDP2's mixed-precision
policy (`planner/cost/mixed_precision.autocasts`). A profile traced in bf16 then misses what
autocast changes in the saved tensors: the residual stream stays fp32 (the embedding's output
is fp32 and a bf16 branch added to it promotes), so whatever a norm computes from it and keeps
is fp32; a norm's fp32 output is cast to bf16 by each matmul that reads it, every copy kept
(autocast caches only the casts of leaf weights): Hugging Face's Llama keeps 3 copies for q, k
and v where the bf16 trace kept the norm's output once, GPT-2's fused QKV one. Rules per norm
kind and projection layout would miss the next model's variant, so this runs the forward
itself: once more, on fake CPU tensors (no memory, no compute: `FakeTensorMode` with fp32
parameters and autocast's CPU dispatch), counting the bytes of every tensor a forward saves
for backward, storages once, the parameters and their low-precision copies left out (the
weight copies are priced per micro-batch, not per sequence).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .swap import swapped_tensors

AUTOCAST_DTYPE = torch.bfloat16
"""The low-precision dtype autocast casts to (fp16 casts the same tensors, same bytes)."""


class _WeightCasts(TorchDispatchMode):
    """Notes the storages of parameter copies (autocast's casts of fp32 weights)."""

    def __init__(self, params: set[int]) -> None:
        super().__init__()
        self.params = params
        self.copies: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        src = args[0] if args else None
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(src, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and id(src.untyped_storage()) in self.params
        ):
            st = out.untyped_storage()
            self.copies.add(id(st))
            weakref.finalize(st, self.copies.discard, id(st))  # its id may be reused once freed
        return out


@contextlib.contextmanager
def _fp32_fake(model: nn.Module, inputs: Any) -> Iterator[tuple[Any, Any]]:
    """The model's parameters and buffers, and `inputs`, as fake CPU tensors (floating ones
    fp32) for the block's duration; yields (fake mode, fake inputs)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    fm = FakeTensorMode(allow_non_fake_inputs=True)
    cpu = torch.device("cpu")

    def fake(t: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if t.is_floating_point() else t.dtype
        meta = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
        return FakeTensor(fm, meta, cpu)

    fake_inputs = tree_map(lambda t: fake(t) if isinstance(t, torch.Tensor) else t, inputs)
    with swapped_tensors(model, fake):
        yield fm, fake_inputs


def autocast_saved_bytes(
    model: nn.Module,
    blocks: tuple[nn.Module, ...],
    inputs: Any,
    run: Callable[[nn.Module, Any], torch.Tensor],
) -> list[float]:
    """Bytes autograd saves per chain segment (0: embedding, 1..len(blocks): the blocks, last:
    the head and its loss) in one forward of `run(model, inputs)` under autocast over fp32
    weights, for the whole traced batch; parameters and their casts left out."""
    saved = [0.0] * (len(blocks) + 2)
    seg = [0]
    seen: set[int] = set()
    handles = []
    last = len(blocks) - 1
    for i, block in enumerate(blocks):

        def pre(_m: nn.Module, _a: Any, i: int = i) -> None:
            seg[0] = i + 1

        def post(_m: nn.Module, _a: Any, _o: Any, i: int = i) -> None:
            if i == last:
                seg[0] = last + 2

        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    try:
        with _fp32_fake(model, inputs) as (fm, fake_inputs):
            params = {id(p.untyped_storage()) for p in model.parameters()}
            casts = _WeightCasts(params)

            def pack(t: torch.Tensor) -> torch.Tensor:
                st = t.untyped_storage()
                key = id(st)
                if key not in seen and key not in params and key not in casts.copies:
                    seen.add(key)
                    weakref.finalize(st, seen.discard, key)  # a later storage may take its id
                    saved[seg[0]] += st.nbytes()
                return t

            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            autocast = torch.autocast("cpu", dtype=AUTOCAST_DTYPE)
            with fm, casts, hooks, autocast:
                run(model, fake_inputs)
    finally:
        for h in handles:
            h.remove()
    return saved
