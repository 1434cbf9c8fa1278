"""Measure a real chain of modules into the solvers' `LayerChain`, with the sizes the simulator
needs.

`profile_chain(layers, example_input)` runs each layer once on its own, forward and backward,
on the layers' device, and counts the bytes of the tensor storages created meanwhile, as
`torch.distributed._tools.mem_tracker.MemTracker` does (a `TorchDispatchMode` that sees every
aten op's outputs and a weak reference per storage that sees it freed). The figures are the
ones the simulator (`paraplan.planner.solvers.simulate`) charges, so that a schedule's
simulated peak is the real one:

- `input_bytes` / `output_bytes`: the storages of the layer's input x_{l-1} and output x_l.
- `saved_bytes`: the input plus every storage the forward leaves alive besides its output
  (what autograd saved: Rotor's x̄, Beaumont et al. 2019 §3). The output, even when the layer
  saves it (ReLU does), is not counted here: it is the next layer's input.
- `fwd_tmp_bytes`: the forward's peak above input + output + saved. The chain model has one
  transient for both kinds of forward; this one is exact for a forward that keeps its saved
  tensors (Rotor's F_all). A forward under checkpoint (F_none) frees them as it goes, yet its
  own peak above input + output can be larger (a GPT-2 small block at 256 tokens: 14.2 MB
  against 1.6 MB), so the simulator understates a peak set by such a forward.
- `bwd_tmp_bytes`: the backward's peak above input + saved + gradient of the output +
  gradient of the input, the simulator's level during a backward. It holds the weight
  gradients computed before being added to the parameters' `.grad`, intermediate gradients,
  and the output when the layer saved it (the simulator frees x_l after the next layer's
  backward). The simulator also gives the chain's input a gradient, which an input that does
  not require grad lacks: the first layer's transient is lowered by that much (down to 0).
- `fwd_s` / `bwd_s`: wall-clock times of that single run (tracking overhead included).

Accounting convention: parameters, buffers and parameter gradients are static memory, outside
the chain. Gradients are allocated before the step, as in gradient accumulation or after
``zero_grad(set_to_none=False)``, so each backward adds its weight gradients into them in
place and the temporary weight-gradient buffer is a transient of that layer's backward.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from paraplan.planner.solvers.chain import ChainLayer, LayerChain


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage behind `t` (what freeing it would give back)."""
    return int(t.untyped_storage().nbytes())


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages created by aten ops while the mode is active and still
    alive, and their peak (after each op, as MemTracker measures). Storages created outside
    the mode are not counted; a storage is counted once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        """Bytes alive now."""
        self.peak = 0
        """Highest `live` since the start or the last `reset_peak`."""
        self._sizes: dict[int, int] = {}

    def reset_peak(self) -> None:
        """Start a new peak from the current level."""
        self.peak = self.live

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._sizes:
            return
        size = int(st.nbytes())
        self._sizes[key] = size
        self.live += size
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # A view or in-place op returns an input's storage: nothing new (parameters included).
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if (
                isinstance(t, torch.Tensor)
                and t.device.type != "meta"
                and id(t.untyped_storage()) not in inputs
            ):
                self._track(t)
        self.peak = max(self.peak, self.live)
        return out


def _check_layers(layers: Sequence[nn.Module], example_input: Any) -> None:
    if isinstance(layers, nn.Module) and not isinstance(layers, nn.Sequential | nn.ModuleList):
        raise ValueError(
            f"layers={type(layers).__name__} must be a sequence of modules forming a chain; "
            "pass e.g. list(model.children()) or an nn.Sequential"
        )
    if len(layers) == 0:
        raise ValueError("layers is empty; a chain needs at least one module")
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ValueError(
                f"layers[{i}]={layer!r} is not an nn.Module; wrap the callable in a module"
            )
    if not isinstance(example_input, torch.Tensor):
        raise ValueError(
            f"example_input is a {type(example_input).__name__}, not a tensor; a chain passes "
            "one tensor from layer to layer (bind other arguments inside the layers)"
        )


def _output(layer_index: int, out: Any) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"layers[{layer_index}] returned a {type(out).__name__}, not a tensor; in a chain "
            "each layer returns the one tensor the next reads: wrap it to return that tensor"
        )
    return out


def profile_chain(
    layers: Sequence[nn.Module], example_input: torch.Tensor, *, name: str = "chain"
) -> LayerChain:
    """The solvers' `LayerChain` of `layers` (layer i reads layer i-1's output; layer 0 reads
    `example_input`; the last returns the loss), measured on the layers' device.

    Each layer runs once forward and once backward on its own, from a detached copy of its
    input (that requires grad when the previous output did), with the gradient of its output
    made by a following op as in a real backward pass. Parameter gradients are fresh zeros
    during the measurement and the caller's are restored afterwards (see the module docstring
    for the convention); like a training step, it updates normalization statistics and draws
    random numbers. Sizes are for this input's shape; train with inputs of the same shape.
    """
    _check_layers(layers, example_input)
    params = [
        p
        for p in dict.fromkeys(p for layer in layers for p in layer.parameters())
        if p.requires_grad
    ]
    saved_grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    chain_layers: list[ChainLayer] = []
    try:
        x = example_input.detach().requires_grad_(example_input.requires_grad)
        for i, layer in enumerate(layers):
            chain_layer, x = _measure_layer(i, layer, x)
            chain_layers.append(chain_layer)
    finally:
        for p, grad in zip(params, saved_grads, strict=True):
            p.grad = grad
    return LayerChain(layers=tuple(chain_layers), name=name)


def _measure_layer(
    index: int, layer: nn.Module, x_in: torch.Tensor
) -> tuple[ChainLayer, torch.Tensor]:
    """One layer's ChainLayer, and a detached copy of its output (the next layer's input)."""
    in_bytes = storage_bytes(x_in)
    counter = LiveBytes()
    start = time.perf_counter()
    with counter:
        y = _output(index, layer(x_in))
    fwd_s = time.perf_counter() - start
    out_bytes = storage_bytes(y)
    kept = counter.live  # output + what autograd saved
    extra = max(0, kept - out_bytes)
    fwd_tmp = max(0, counter.peak - kept)
    nxt = y.detach().clone().requires_grad_(y.requires_grad)
    bwd_s, bwd_tmp = 0.0, 0
    if y.requires_grad:
        seed = torch.ones_like(y)
        with counter:
            # y * seed saves seed only, so y stays alive only if the layer saved it; its
            # backward makes the gradient of y, which autograd frees once consumed.
            loss = (y * seed).sum()
        del y
        counter.reset_peak()
        start = time.perf_counter()
        with counter:
            loss.backward()
        bwd_s = time.perf_counter() - start
        # Simulator's level during a backward: input + saved + grad of output + grad of input.
        bwd_tmp = max(0, counter.peak - extra - out_bytes - in_bytes)
    chain_layer = ChainLayer(
        name=f"{index}:{type(layer).__name__}",
        fwd_s=fwd_s,
        bwd_s=bwd_s,
        input_bytes=float(in_bytes),
        saved_bytes=float(in_bytes + extra),
        output_bytes=float(out_bytes),
        fwd_tmp_bytes=float(fwd_tmp),
        bwd_tmp_bytes=float(bwd_tmp),
    )
    return chain_layer, nxt
