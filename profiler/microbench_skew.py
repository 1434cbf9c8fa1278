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


def sync_skew_s(rounds: int) -> float:
    """Median seconds a one-element all-reduce takes beyond its own time after a segment of
    dispatch-bound host work (`SEGMENTS_S`), over `rounds` alternations; 0 or more, the same
    on every rank (the ranks' largest)."""
    w = torch.ones(1, requires_grad=True)
    one = torch.ones(1)

    def segment(ops: int) -> None:
        y = w
        for _ in range(ops):
            y = y * 1.0
        y.sum().backward()

    calls = 400
    per_op = _timed(lambda: segment(calls), 3) / calls
    agreed = torch.tensor([per_op], dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    per_op = float(agreed)
    extra: list[float] = []
    for _ in range(rounds):
        for seconds in SEGMENTS_S:
            ops = max(1, round(seconds / per_op))
            iters = max(5, round(SPAN_S / seconds))

            def work(ops: int = ops) -> None:
                segment(ops)

            def synced(ops: int = ops) -> None:
                segment(ops)
                dist.all_reduce(one)

            alone = _timed(work, iters)
            reduce = _timed(lambda: dist.all_reduce(one), iters)
            both = _timed(synced, iters)
            extra.append(both - alone - reduce)
    mine = torch.tensor([max(0.0, statistics.median(extra))], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)
