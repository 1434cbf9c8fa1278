"""The traced operator counts a calibrated device is priced from (`cost/eager.py`): checked
against an independent count over the real modules, bytes derived by hand, and torch's own
AdamW."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from paraplan.planner.cost.eager import ADAMW_OPS_PER_TENSOR
from paraplan.profiler.api import profile

from .profiler_models import hf


class _Count(TorchDispatchMode):
    """Counts aten operators (no tracer involved)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _Scale(nn.Module):
    """y = tanh(x * 2 + 1): one multiply, one add, one tanh over (B, S, H)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2.0 + 1.0)


class _Chain(nn.Module):
    """Linear, two blocks of `block`, Linear: the blocks are what the tracer measures."""

    def __init__(self, block: type[nn.Module] = _Scale) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList([block(), block()])
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def test_block_traffic_and_transcendentals_match_a_hand_count() -> None:
    """A block of mul, add and tanh on (2, 8, 16) fp32: the multiply and the add each read
    and write one tensor (2 x 4 x 128 bytes per sequence each), tanh is a transcendental of
    128 elements per sequence; forward dispatches those three operators (the tracer's block
    hooks add up to two views of the block's input and output)."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    prof = profile(_Chain(), (x,), blocks="blocks", loss_fn=lambda y: y.sum(), repeats=0)
    block = prof.layers[1]
    per_seq_elems = 8 * 16
    assert 3 <= block.fwd_ops <= 5
    assert block.fwd_stream_bytes == 2 * (2 * 4 * per_seq_elems)
    assert [(o.op, o.elems) for o in block.fwd_special] == [("aten.tanh", per_seq_elems)]
    assert block.bwd_ops >= 2 and block.param_tensors == 0
    assert prof.layers[0].param_tensors == 2  # the input Linear's weight and bias


def test_gpt2_block_operator_counts_match_the_real_module() -> None:
    """Forward operators of a Hugging Face GPT-2 block, as traced, equal a plain dispatch
    count of the same block called on its own (eager CPU, sdpa attention)."""
    model, inputs = hf("gpt2")
    prof = profile(model, inputs, repeats=0)
    block = model.transformer.h[1]
    x = torch.randn(2, 32, 64)
    counter = _Count()
    with counter:
        block(x)
    traced = prof.layers[2].fwd_ops
    assert abs(traced - counter.ops) <= 2, (traced, counter.ops)
    # gelu_new is written out: tanh is the block's one transcendental
    assert [o.op for o in prof.layers[2].fwd_special] == ["aten.tanh"]
    assert prof.layers[2].param_tensors == 12
    assert sorted(prof.layers[2].param_tensor_sizes) == sorted(
        p.numel() for p in block.parameters()
    )
    # what an activation checkpoint's hooks see: every tensor autograd saves in the block's
    # forward, counted here by hooks of our own on the block called alone
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x.requires_grad_())
    assert prof.layers[2].saved_tensors == saved > 10, (prof.layers[2].saved_tensors, saved)


def _adamw_step_ops(tensors: int) -> int:
    params = [nn.Parameter(torch.randn(4, 4)) for _ in range(tensors)]
    opt = torch.optim.AdamW(params, foreach=False)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # the first step creates the states
    counter = _Count()
    with counter:
        opt.step()
    return counter.ops


def test_single_tensor_adamw_operators_per_tensor() -> None:
    """`ADAMW_OPS_PER_TENSOR` is what torch's single-tensor AdamW dispatches per parameter
    tensor (the difference between 10 and 5 tensors: a step's fixed operators cancel)."""
    assert _adamw_step_ops(10) - _adamw_step_ops(5) == 5 * ADAMW_OPS_PER_TENSOR
