"""What a collective waits beyond its own time when the ranks worked before it.

Two ranks that run the same host work between two collectives do not finish it at the same
moment: each is delayed by its own interrupts, page faults and scheduling, so the collective
starts when the slower one arrives, and the faster one waits. The collectives microbenchmark
times collectives back to back, with no work in between, so its fitted latency leaves this
out. Measured here on the ranks' group (2026-11-26, 2 gloo ranks on this 2-core VM, quiet):
a dispatch-bound segment of 0.2-3.4 ms followed by a one-element all-reduce took 0.2-0.4 ms
more per iteration than the segment and the all-reduce timed apart (0.8-1.5 ms for 6-14 ms
segments). The planner adds it once to every collective of a calibrated host CPU
(`cost.comm.Collectives`); a GPU's streams absorb the host's jitter, so it is not measured
there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

SEGMENTS_S = (1e-3, 2e-3, 4e-3)
"""Host work between two collectives, about as long as an FSDP unit's or a pipeline stage's
micro-batch on the closed loop's small models."""
SPAN_S = 0.15
"""Seconds of iterations per measurement."""


def _timed(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call of `fn`, the ranks started together."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _segment_fn(w: torch.Tensor) -> Callable[[int], None]:
    def segment(ops: int) -> None:
        y = w
        for _ in range(ops):
            y = y * 1.0
        y.sum().backward()

    return segment


def _agreed_per_op_s(segment: Callable[[int], None]) -> float:
    """Seconds per operator of `segment`, the ranks' largest (a collective: every rank)."""
    calls = 400
    per_op = _timed(lambda: segment(calls), 3) / calls
    agreed = torch.tensor([per_op], dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return float(agreed)


def _extra_s(segment: Callable[[int], None], ops: int, iters: int, one: torch.Tensor) -> float:
    """Seconds a one-element all-reduce after `ops` operators of `segment` takes beyond the
    segment and the all-reduce timed apart (`iters` calls of each)."""

    def synced() -> None:
        segment(ops)
        dist.all_reduce(one)

    alone = _timed(lambda: segment(ops), iters)
    reduce = _timed(lambda: dist.all_reduce(one), iters)
    return _timed(synced, iters) - alone - reduce


def _ranks_largest(seconds: float) -> float:
    mine = torch.tensor([max(0.0, seconds)], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def sync_skew_s(rounds: int) -> float:
    """Median seconds a one-element all-reduce takes beyond its own time after a segment of
    dispatch-bound host work (`SEGMENTS_S`), over `rounds` alternations; 0 or more, the same
    on every rank (the ranks' largest)."""
    w = torch.ones(1, requires_grad=True)
    one = torch.ones(1)
    segment = _segment_fn(w)
    per_op = _agreed_per_op_s(segment)
    extra: list[float] = []
    for _ in range(rounds):
        for seconds in SEGMENTS_S:
            ops = max(1, round(seconds / per_op))
            extra.append(_extra_s(segment, ops, max(5, round(SPAN_S / seconds)), one))
    return _ranks_largest(statistics.median(extra))


SAMPLE_SPAN_S = 0.01
"""Seconds of iterations per timing of one span sample (`SkewSampler`): three timings of ~10
ms, ~30 ms a progress point, a few seconds over a full calibration."""
MIN_SAMPLES = 10
"""Fewer span samples than this keep `sync_skew_s`'s figure."""


class SkewSampler:
    """The sync skew measured again at every progress point of a calibration, one segment
    length of `SEGMENTS_S` in turn, on every rank together (each sample runs collectives: a
    rank's progress points are the same points on every rank).

    `sync_skew_s` measures for ~4 s at one moment of the calibration, and that moment sets
    what every collective of a CPU plan pays: six calibrations within twelve minutes of one
    another (2026-11-29, nothing else running) read 454, 682, 660, 615, 1319 and 754 us, and
    the 1319 priced the tiny GPT-2's FSDP and TP+SP plans 30-40% above the other five. The
    median of a couple of hundred short samples spread over the calibration's minutes is the
    skew of the machine's usual state, as `microbench_dispatch` does for the operator cost."""

    def __init__(self) -> None:
        self._w = torch.ones(1, requires_grad=True)
        self._one = torch.ones(1)
        self._segment = _segment_fn(self._w)
        self._per_op_s = _agreed_per_op_s(self._segment)
        self.samples: list[float] = []

    def sample(self) -> None:
        """One more sample (a collective: call it on every rank)."""
        seconds = SEGMENTS_S[len(self.samples) % len(SEGMENTS_S)]
        ops = max(1, round(seconds / self._per_op_s))
        iters = max(3, round(SAMPLE_SPAN_S / seconds))
        self.samples.append(_extra_s(self._segment, ops, iters, self._one))

    def skew_s(self, fallback: Callable[[], float]) -> float:
        """The samples' median, the ranks' largest; `fallback()` with too few samples (the
        same count on every rank, so every rank takes the same branch)."""
        if len(self.samples) < MIN_SAMPLES:
            return fallback()
        return _ranks_largest(statistics.median(self.samples))
