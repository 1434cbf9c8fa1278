"""MoE experts while profiling: balanced routing, so their FLOPs are counted.

Hugging Face's fused experts (Mixtral's `MixtralExperts`: `gate_up_proj` (E, 2F, H) and
`down_proj` (E, H, F)) pick the experts each token uses with `nonzero` over the router's
choice, a value the meta/fake tensors of a trace do not have (the loop then runs no expert),
and on real tensors they may dispatch to grouped-GEMM kernels the FLOP counter does not know:
either way the profile left out the expert FFN (the bulk of a MoE block's FLOPs). While
profiling, each such module computes with a fixed, balanced routing instead: the
N*top_k (token, expert) assignments split into E equal groups, one per expert, which is
what the analytic model assumes (every expert gets N*top_k/E tokens; Fedus et al. 2021
§2.2 with capacity factor 1), so FLOPs, parameters and saved activations are those of a
balanced step. The router itself runs unchanged. The outputs are not the model's: use it
for counting and timing only.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def is_fused_experts(module: nn.Module) -> bool:
    """A Hugging Face fused-experts module (3-D `gate_up_proj` and `down_proj`, and a gate:
    `act_fn`, or `_apply_gate` as GPT-OSS's clamped, interleaved SwiGLU)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == 3
        and down.dim() == 3
        and (hasattr(module, "act_fn") or hasattr(module, "_apply_gate"))
    )


def _gated(self: Any, gate_up: torch.Tensor) -> torch.Tensor:
    """(..., 2F) -> (..., F): the class's own gate where it has one (`_apply_gate`: GPT-OSS's
    clamped, interleaved pairs), else act(gate) * up over the concatenated [gate; up]."""
    if hasattr(self, "_apply_gate"):
        return self._apply_gate(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return self.act_fn(gate) * up


def _expert_ffn(self: Any, e: int, rows: torch.Tensor) -> torch.Tensor:
    """Expert `e`'s FFN on `rows` (R, H) in the module's own layout, as transformers'
    `use_experts_implementation` states it: weights (E, out, in), or (E, in, out) when
    `is_transposed` (GPT-OSS), with biases when `has_bias`, gated by `_apply_gate` where the
    class has one (concatenated [gate; up] or GPT-OSS's interleaved pairs)."""
    transposed = bool(getattr(self, "is_transposed", False))
    bias = bool(getattr(self, "has_bias", False))

    def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight if transposed else F.linear(x, weight)

    gate_up = project(rows, self.gate_up_proj[e])  # (R, 2F)
    if bias:
        gate_up = gate_up + self.gate_up_proj_bias[e]
    out = project(_gated(self, gate_up), self.down_proj[e])  # (R, H)
    return out + self.down_proj_bias[e] if bias else out


def _project_batched(self: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (E, R, in) through every expert's slice of a 3-D `weight` at once: (E, R, out).

    The weight's gradient is formed in the weight's own layout, as torch's grouped GEMM
    (`torch._grouped_mm`, which torchtitan runs its experts on) writes it: for (E, in, out)
    weights (`is_transposed`, GPT-OSS) x W, whose gradient x^T dy is (E, in, out); for
    (E, out, in), (W x^T)^T, whose gradient dy^T x is (E, out, in). Batched as x W^T instead,
    the gradient comes out transposed and accumulating it into the weight copies it: a whole
    expert weight of backward transient no grouped GEMM has (DeepSeek-V3's gate-and-up weight,
    15 GB, was priced per sequence)."""
    if getattr(self, "is_transposed", False):
        return torch.bmm(x, weight)
    return torch.bmm(weight, x.transpose(1, 2)).transpose(1, 2)


def _experts_batched(self: Any, rows: torch.Tensor) -> torch.Tensor:
    """Every expert's FFN at once on `rows` (E, R, H), as one batched matmul over each 3-D
    weight (`_project_batched`), the way a grouped GEMM runs them: its backward computes each
    weight's gradient once, where indexing the weight per expert (`_expert_ffn`) makes every
    expert's backward materialize a zero gradient of the whole (E, out, in) weight (the profile
    then priced 1.5-1.7x the block's expert weights as backward transients)."""
    bias = bool(getattr(self, "has_bias", False))
    gate_up = _project_batched(self, rows, self.gate_up_proj)  # (E, R, 2F)
    if bias:
        gate_up = gate_up + self.gate_up_proj_bias.unsqueeze(1)
    out = _project_batched(self, _gated(self, gate_up), self.down_proj)  # (E, R, H)
    return out + self.down_proj_bias.unsqueeze(1) if bias else out


def balanced_experts_forward(
    self: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """hidden (N, H), top_k_index/top_k_weights (N, k) -> (N, H), every expert given an equal
    share of the N*k assignments (the first N*k mod E experts one more): one batched matmul
    where the shares are equal, else expert by expert."""
    n, k = top_k_index.shape
    experts = self.gate_up_proj.shape[0]
    rows = hidden.unsqueeze(1).expand(n, k, hidden.shape[1]).reshape(n * k, -1)  # (N*k, H)
    base, extra = divmod(n * k, experts)
    if base and not extra:
        out = _experts_batched(self, rows.view(experts, base, -1)).reshape(n * k, -1)
    else:
        sizes = [base + (1 if e < extra else 0) for e in range(experts)]
        parts = enumerate(rows.split(sizes))
        out = torch.cat([_expert_ffn(self, e, part) for e, part in parts if part.shape[0]])
    out = out * top_k_weights.reshape(n * k, 1).to(hidden.dtype)  # (N*k, H)
    return out.view(n, k, -1).sum(dim=1)  # (N, H)


@contextlib.contextmanager
def balanced_experts(model: nn.Module) -> Iterator[int]:
    """Within the block, every fused-experts module of `model` routes as balanced; yields how
    many modules were switched (restored afterwards)."""
    switched = [m for m in model.modules() if is_fused_experts(m)]
    for m in switched:
        m.forward = types.MethodType(balanced_experts_forward, m)  # type: ignore[method-assign]
    try:
        yield len(switched)
    finally:
        for m in switched:
            del m.forward  # back to the class's forward
