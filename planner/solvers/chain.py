"""The chain model the solvers share: a sequence of layers, each with its times and sizes.

A chain is what Rotor works on (Beaumont et al. 2019, "Optimal checkpointing for heterogeneous
chains", §3): layer l reads the activation x_{l-1} and writes x_l; run normally it also keeps
what its backward needs. Gradients have the size of the activations they belong to; the
gradient of the last layer's output is the seed of the backward pass (for a scalar loss a few
bytes), allocated right before the first backward operation.

Units: seconds and bytes, per micro-batch (the whole micro-batch, not one sequence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_REL_TOL = 1e-9
"""Relative tolerance when checking that layer l's input is layer l-1's output."""


def check_nonnegative(owner: str, field: str, value: float, unit: str) -> None:
    """Raise ValueError unless `value` is a finite number >= 0 (names the value, rule and fix)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(
            f"{owner}: {field}={value!r} must be a number of {unit}; pass a float or an int"
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{owner}: {field}={value!r} must be a finite number >= 0 ({unit}); "
            "fix the profile or the value passed"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ChainLayer:
    """One layer of a chain: its forward/backward times and the bytes it holds."""

    name: str
    """Layer name, e.g. ``"block.3"``."""
    fwd_s: float
    """Forward time of the layer (also what each recomputation costs)."""
    bwd_s: float
    """Backward time of the layer (input and weight gradients)."""
    input_bytes: float
    """Bytes of the activation entering the layer, x_{l-1}: all that "keep input only"
    (checkpointing the layer) stores. Must equal the previous layer's `output_bytes`."""
    saved_bytes: float
    """Bytes the layer keeps for its backward when run normally, its input included (so
    `saved_bytes >= input_bytes`). Its output is included only if the backward reads it (e.g.
    a softmax output); the output as the next layer's input is counted there, not here."""
    output_bytes: float
    """Bytes of the activation leaving the layer, x_l (the next layer's input; for the last
    layer the loss, whose gradient seeds the backward pass)."""
    fwd_tmp_bytes: float = 0.0
    """Transient bytes allocated inside the forward and freed before it returns."""
    bwd_tmp_bytes: float = 0.0
    """Transient bytes allocated inside the backward and freed before it returns."""

    def __post_init__(self) -> None:
        owner = f"chain layer {self.name!r}"
        check_nonnegative(owner, "fwd_s", self.fwd_s, "seconds")
        check_nonnegative(owner, "bwd_s", self.bwd_s, "seconds")
        for field in ("input_bytes", "saved_bytes", "output_bytes"):
            check_nonnegative(owner, field, getattr(self, field), "bytes")
        check_nonnegative(owner, "fwd_tmp_bytes", self.fwd_tmp_bytes, "bytes")
        check_nonnegative(owner, "bwd_tmp_bytes", self.bwd_tmp_bytes, "bytes")
        if self.saved_bytes < self.input_bytes * (1 - _REL_TOL):
            raise ValueError(
                f"{owner}: saved_bytes={self.saved_bytes!r} < input_bytes={self.input_bytes!r}, "
                "but saved_bytes includes the layer's input; add the input to saved_bytes"
            )

    @property
    def extra_saved_bytes(self) -> float:
        """What "store all" keeps beyond the input: `saved_bytes - input_bytes`."""
        return max(0.0, self.saved_bytes - self.input_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerChain:
    """A sequence of layers, each reading the previous one's output."""

    layers: tuple[ChainLayer, ...]
    """The layers in execution order (at least one)."""
    name: str = "chain"
    """Human name for messages and reports."""

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple) or not self.layers:
            raise ValueError(
                f"chain {self.name!r}: layers={self.layers!r} must be a non-empty tuple of "
                "ChainLayer; pass at least one layer"
            )
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, ChainLayer):
                raise ValueError(
                    f"chain {self.name!r}: layers[{i}]={layer!r} is not a ChainLayer; "
                    "build each layer with ChainLayer(...)"
                )
        for prev, layer in zip(self.layers, self.layers[1:], strict=False):
            scale = max(prev.output_bytes, layer.input_bytes, 1.0)
            if abs(prev.output_bytes - layer.input_bytes) > _REL_TOL * scale:
                raise ValueError(
                    f"chain {self.name!r}: layer {layer.name!r} has input_bytes="
                    f"{layer.input_bytes!r} but the previous layer {prev.name!r} has "
                    f"output_bytes={prev.output_bytes!r}; in a chain they are the same tensor, "
                    "so make them equal"
                )

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def input_bytes(self) -> float:
        """Bytes of the chain's input x_0 (present from the start)."""
        return self.layers[0].input_bytes

    @property
    def store_all_makespan_s(self) -> float:
        """Time of one forward and one backward per layer, no recomputation."""
        return sum(layer.fwd_s + layer.bwd_s for layer in self.layers)
