"""The calibration's GEMM grid runs the GEMMs an `nn.Linear` runs, with the same operand
layouts: on a CPU without bf16 units the emulated bf16 GEMM's rate depends on the layout by
10x or more (0.9 GFLOP/s for `x @ w` with w stored (K, N), 10 for the Linear's `x @ w^T` at
1024^3, 2026-11-26), so a grid measured in another layout prices every bf16 plan wrongly.
Compared here by recording the matrix products autograd dispatches for an `nn.Linear`."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paraplan.profiler.microbench import _gemm_backward, _gemm_forward

M, N, K = 24, 40, 56  # distinct, so that every shape names its operands


class _Products(TorchDispatchMode):
    """(shape, stride) of both operands of every mm/addmm dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func._overloadpacket)
        if name in ("aten.mm", "aten.addmm"):
            a, b = args[-2:]  # addmm(bias, a, b)
            self.seen.append(((tuple(a.shape), a.stride()), (tuple(b.shape), b.stride())))
        return func(*args, **(kwargs or {}))


def test_gemm_grid_runs_the_linear_layouts() -> None:
    linear_module = torch.nn.Linear(K, N)  # its weight stored (N, K), with a bias
    x = torch.randn(2, M // 2, K, requires_grad=True)  # (B, T, K), as a block feeds it
    g = torch.randn(2, M // 2, N)
    with _Products() as linear:
        linear_module(x).backward(g)
    w = linear_module.weight.detach()
    x2, g2 = x.detach().reshape(M, K), g.reshape(M, N)
    with _Products() as forward:
        _gemm_forward(x2, w, g2)
    with _Products() as backward:
        _gemm_backward(x2, w, g2)
    assert linear.seen[:1] == forward.seen
    assert sorted(linear.seen[1:]) == sorted(backward.seen)
    assert len(backward.seen) == 2
