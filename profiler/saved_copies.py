"""What a traced model's eager modules keep for backward that fused kernels do not: the
normalized copy an unfused norm keeps beside its input (Hugging Face's RMSNorm: x * rsqrt(var),
and under bf16 its fp32 cast of x) and silu(gate), which an eager gated MLP's multiply keeps
(`LayerCost.act_norm_copy_bytes`, `act_glu_copy_bytes`; `Runtime.norm_keeps_input_only`,
`glu_keeps_input_only`). The tracer (`tracer.py`) reports its norm calls, the storages autograd
saves and the forward's ops here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_SILU = ("aten.silu.default", "aten.silu_.default")
_MUL = ("aten.mul.Tensor",)


@dataclass(slots=True)
class _NormCall:
    """One norm module's forward in progress."""

    input_bytes: float
    """What a fused norm keeps of its input (0 where the input was already saved before)."""
    numel: int
    """Elements of its input: a saved tensor this large is hidden-state-sized."""
    saved_bytes: float = 0.0
    """Hidden-state-sized bytes it saved, first saves only."""


@dataclass(slots=True)
class SavedCopies:
    """Counts, per traced forward, the copies fused kernels would not keep."""

    _norms: list[_NormCall] = field(default_factory=list)
    _silu: set[int] = field(default_factory=set)
    _counted: set[int] = field(default_factory=set)

    def enter_norm(self, inputs: Iterable[torch.Tensor], saved: set[int]) -> None:
        """A norm module starts; `saved`: the storages autograd has saved so far."""
        tensors = [t for t in inputs if t.is_floating_point()]
        fresh = [t for t in tensors if id(t.untyped_storage()) not in saved]
        numel = max((t.numel() for t in tensors), default=0)
        self._norms.append(_NormCall(sum(t.untyped_storage().nbytes() for t in fresh), numel))

    def leave_norm(self) -> float:
        """The norm ends: the bytes it saved beyond its input (its normalized copies)."""
        call = self._norms.pop()
        return max(0.0, call.saved_bytes - call.input_bytes)

    def saved(self, t: torch.Tensor, nbytes: int) -> None:
        """Autograd saves `t` for the first time (`nbytes` its storage's)."""
        if self._norms and self._norms[-1].numel and t.numel() >= self._norms[-1].numel:
            self._norms[-1].saved_bytes += nbytes

    def op(self, func: Any, args: Any, out: Any, saved: set[int]) -> float:
        """A forward op ran (`args`, `out`: its arguments and result, any nesting): silu's
        outputs are noted; a multiply of one (a gated MLP's silu(gate) * up), which autograd
        saved for it, counts once. Returns the bytes counted. Other ops cost a name check."""
        name = str(func)
        if name in _SILU:
            self._silu.update(id(t.untyped_storage()) for t in _tensors(out))
            return 0.0
        if name not in _MUL:
            return 0.0
        found = 0.0
        for t in _tensors(args):
            key = id(t.untyped_storage())
            if key in self._silu and key in saved and key not in self._counted:
                self._counted.add(key)
                found += t.untyped_storage().nbytes()
        return found


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]
