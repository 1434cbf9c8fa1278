"""Rotating operands of the calibration's microbenchmarks (`profiler/microbench_cold.py`)."""

from __future__ import annotations

import pytest
import torch

from paraplan.profiler.microbench_cold import ALIGN_ELEMS, ColdPool


def _pool(nbytes: int) -> ColdPool:
    return ColdPool(torch.float32, torch.device("cpu"), nbytes)


def test_every_slot_is_distinct_and_the_whole_buffer_is_visited_before_one_returns() -> None:
    pool = _pool(4 * 100_000)  # 100,000 floats
    ops = pool.operands([(3, 4), (5,)])  # 12 and 5 floats, each at an aligned start
    slot = 2 * ALIGN_ELEMS
    assert len(ops) == 100_000 // slot
    seen = []
    for _ in range(len(ops)):
        a, b = ops.next()
        assert a.shape == (3, 4) and b.shape == (5,)
        assert a.data_ptr() + ALIGN_ELEMS * 4 == b.data_ptr()  # one slot holds both in turn
        seen.append(a.data_ptr())
    assert len(set(seen)) == len(ops)
    base = pool.buffer.data_ptr()
    assert min(seen) == base and max(seen) + slot * 4 <= base + 100_000 * 4
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


@pytest.mark.parametrize("shapes", [[(1, 16, 16384, 16)] * 3, [(37, 5), (5, 3), (37, 3)]])
def test_views_start_aligned(shapes: list[tuple[int, ...]]) -> None:
    """Fused attention on a GPU refuses operands that are not 16-byte aligned (the first GPU
    calibration, 2026-11-26: 'CUDA error: misaligned address' in the attention curve, whose
    q, k and v sat at odd offsets of the pool)."""
    pool = ColdPool(torch.bfloat16, torch.device("cpu"), nbytes=2**26)
    base, elem = pool.buffer.data_ptr(), pool.buffer.element_size()
    views = pool.operands(shapes)
    assert len(views) > 1
    for _ in range(len(views)):
        for v in views.next():
            assert (v.data_ptr() - base) % (16 * elem) == 0
