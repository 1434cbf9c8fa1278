"""Rotating operands of the calibration's microbenchmarks (`profiler/microbench_cold.py`)."""

from __future__ import annotations

import torch

from paraplan.profiler.microbench_cold import ColdPool


def _pool(nbytes: int) -> ColdPool:
    return ColdPool(torch.float32, torch.device("cpu"), nbytes)


def test_every_slot_is_distinct_and_the_whole_buffer_is_visited_before_one_returns() -> None:
    pool = _pool(4 * 1000)  # 1000 floats
    ops = pool.operands([(3, 4), (5,)])  # 17 floats a slot: 58 slots
    assert len(ops) == 1000 // 17
    seen = []
    for _ in range(len(ops)):
        a, b = ops.next()
        assert a.shape == (3, 4) and b.shape == (5,)
        assert a.data_ptr() + 12 * 4 == b.data_ptr()  # one slot holds the operands in turn
        seen.append(a.data_ptr())
    assert len(set(seen)) == len(ops)
    base = pool.buffer.data_ptr()
    assert min(seen) == base and max(seen) + 17 * 4 <= base + 1000 * 4
    assert ops.next()[0].data_ptr() == seen[0]  # then it starts over


def test_slots_spread_over_the_buffer_when_capped() -> None:
    pool = _pool(4 * 2**20)  # 1 Mi floats, 1-float slots: capped at MAX_SLOTS
    ops = pool.operands([(1,)])
    first, second = ops.next()[0].data_ptr(), ops.next()[0].data_ptr()
    assert second - first == 4 * (2**20 // len(ops)) > 4


def test_an_operand_larger_than_the_pool_gets_its_own_tensor() -> None:
    ops = _pool(4 * 16).operands([(8, 8)])
    assert len(ops) == 1 and ops.next()[0].shape == (8, 8)


def test_gradient_leaves_share_the_buffer_and_take_gradients() -> None:
    pool = _pool(4 * 4096)
    ops = pool.operands([(4, 4), (4, 4)], requires_grad=True)
    x, w = ops.next()
    assert (
        x.is_leaf
        and x.requires_grad
        and x.untyped_storage().data_ptr() == (pool.buffer.untyped_storage().data_ptr())
    )
    (gx,) = torch.autograd.grad((x @ w).sum(), (x,))
    assert torch.equal(gx, torch.full((4, 4), 4.0))  # the pool holds ones
