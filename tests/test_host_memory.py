"""Host memory as a CPU run measures it (profiler/host_memory.py): the peak rise of torch's
CPU allocations over a step, checked against known allocations and against torch's own
MemTracker, and the allocator's retained free heap, checked by freeing heap chunks."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from paraplan.profiler.host_memory import (
    TensorPeakTracker,
    allocator_free_bytes,
    live_resident_bytes,
    peak_resident_bytes,
    resident_bytes,
)

MIB = 2**20


def test_rise_of_known_allocations_is_exact() -> None:
    before = torch.ones(4 * MIB // 4)  # live before the count: its free is not seen
    with TensorPeakTracker() as t:
        a = torch.empty(8 * MIB, dtype=torch.uint8)
        b = torch.empty(4 * MIB, dtype=torch.uint8)
        del a
        c = torch.empty(2 * MIB, dtype=torch.uint8)
        del before
    r = t.result()
    assert r.events >= 4
    assert r.rise_bytes == 12 * MIB  # a and b together; c came after a was freed
    assert r.live_peak_bytes == r.start_bytes + r.rise_bytes
    del b, c


def test_rise_equals_memtracker_over_a_training_step() -> None:
    """The reference: MemTracker's peak less what it saw live at the step's start."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    )
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    x = torch.randn(512, 256)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()  # optimizer states exist from here on
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        opt.zero_grad()
        start = mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
        model(x).square().mean().backward()
        opt.step()
    reference = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] - start
    opt.zero_grad()
    with TensorPeakTracker() as t:
        model(x).square().mean().backward()
        opt.step()
    assert t.result().rise_bytes == pytest.approx(reference, rel=0.02)


@pytest.mark.skipif(allocator_free_bytes() is None, reason="needs glibc's mallinfo2")
def test_freed_heap_is_counted_free_not_live() -> None:
    """Chunks below glibc's mmap threshold stay in its heap when freed: resident, but free."""
    chunks = [torch.ones(16 * 1024 // 4) for _ in range(4096)]  # 64 MiB of 16 KiB chunks
    free_before, live_before = allocator_free_bytes(), live_resident_bytes()
    del chunks[:-1]  # the last one pins the heap's top: the rest cannot be trimmed
    free_after, live_after = allocator_free_bytes(), live_resident_bytes()
    assert free_before is not None and free_after is not None
    assert free_after - free_before > 48 * MIB
    assert live_before - live_after > 48 * MIB
    assert resident_bytes() > live_after


def test_peak_resident_is_at_least_resident_now() -> None:
    assert peak_resident_bytes() >= resident_bytes() * 0.99 or sys.platform == "darwin"
    assert 0 < live_resident_bytes() <= resident_bytes()
