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


def _ranks_largest(seconds: float) -> float:
    """The largest of every rank's `seconds` (a collective: every rank)."""
    agreed = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return float(agreed)


class SkewSampler:
    """Rounds of the skew measurement taken at several points of a calibration (every rank
    calls `sample` at the same points, in step with its other collectives), and their median
    at the end. One round is three timings of ~0.15 s per segment; a round's figure alone
    varies by half its value from one second to the next (2026-11-29, 156 rounds over three
    minutes, 2 gloo ranks on this VM: lag-one autocorrelation 0.17, the median of 3 rounds
    -68%..+158% around the three minutes' median, of 12 rounds -28%..+27%), so twelve rounds
    over the calibration's minutes replace the three it took at its end."""

    def __init__(self) -> None:
        self.extra_s: list[float] = []
        self._w = torch.ones(1, requires_grad=True)
        self._one = torch.ones(1)

    def _segment(self, ops: int) -> None:
        y = self._w
        for _ in range(ops):
            y = y * 1.0
        y.sum().backward()

    def sample(self, rounds: int) -> None:
        """Time `rounds` alternations of every segment length (collective: every rank)."""
        calls = 400
        per_op = _ranks_largest(_timed(lambda: self._segment(calls), 3) / calls)
        for _ in range(rounds):
            for seconds in SEGMENTS_S:
                ops = max(1, round(seconds / per_op))
                iters = max(5, round(SPAN_S / seconds))

                def work(ops: int = ops) -> None:
                    self._segment(ops)

                def synced(ops: int = ops) -> None:
                    self._segment(ops)
                    dist.all_reduce(self._one)

                alone = _timed(work, iters)
                reduce = _timed(lambda: dist.all_reduce(self._one), iters)
                both = _timed(synced, iters)
                self.extra_s.append(both - alone - reduce)

    def figure_s(self) -> float:
        """The median wait of every round sampled, 0 or more, the same on every rank (the
        ranks' largest); 0 when nothing was sampled (collective: every rank)."""
        return _ranks_largest(max(0.0, statistics.median(self.extra_s)) if self.extra_s else 0.0)
