"""Measured forward/backward time per chain segment: timestamps at the same hook points the
tracer uses, median over repeated steps after warm-up (CUDA: events; CPU: perf_counter)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

FWD, BWD = 0, 1


class _Clock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[int, int, Any]] = []

    def mark(self, phase: int, seg: int) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((phase, seg, ev))
        else:
            self.marks.append((phase, seg, time.perf_counter()))

    def durations(self, num_segments: int) -> list[list[float]]:
        if self.cuda:
            torch.cuda.synchronize()
        out = [[0.0] * num_segments for _ in range(2)]
        for (phase, seg, t0), (_, _, t1) in zip(self.marks, self.marks[1:], strict=False):
            dt = t0.elapsed_time(t1) / 1e3 if self.cuda else t1 - t0
            out[phase][seg] += dt
        return out


def measure_times(
    model: nn.Module,
    blocks: tuple[nn.Module, ...],
    step: Callable[[Callable], None],
    *,
    device: torch.device,
    warmup: int,
    repeats: int,
    tick: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Median seconds per (phase, segment) of a training step. `step(mark)` runs one forward
    and backward, calling mark(phase, segment) before the forward, before the backward, and
    after it (the block hooks mark the rest)."""
    clock = _Clock(device)
    last = len(blocks) - 1
    handles = []
    for i, block in enumerate(blocks):
        handles += [
            block.register_forward_pre_hook(lambda *_a, i=i: clock.mark(FWD, i + 1)),
            block.register_forward_hook(
                lambda *_a, i=i: clock.mark(FWD, last + 2) if i == last else None
            ),
            block.register_full_backward_pre_hook(lambda *_a, i=i: clock.mark(BWD, i + 1)),
            block.register_full_backward_hook(lambda *_a, i=i: clock.mark(BWD, i)),
        ]
    samples: list[list[list[float]]] = []
    try:
        for rep in range(warmup + repeats):
            clock.marks.clear()
            step(clock.mark)
            if rep >= warmup:
                samples.append(clock.durations(len(blocks) + 2))
            if tick is not None:
                tick()
    finally:
        for h in handles:
            h.remove()
    return [
        [statistics.median(s[phase][seg] for s in samples) for seg in range(len(blocks) + 2)]
        for phase in (FWD, BWD)
    ]
