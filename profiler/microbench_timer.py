"""The clock of the microbenchmarks: callables timed in lockstep with the other ranks."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

MIN_SPAN_S = 0.005
"""Seconds the timed calls of one measurement span at least (a 10 us GEMM measured 5 times
jittered by 1.5x between calibrations on this shared VM)."""
MAX_REPEATS = 101
"""Most timed calls per measurement."""


class Timer:
    """Times callables in lockstep with the other ranks (median of repeats)."""

    def __init__(self, device: torch.device, repeats: int, *, group: bool) -> None:
        self.device = device
        self.repeats = repeats
        self.group = group

    def _repeats_for(self, warm_s: float) -> int:
        """Timed calls for a call that took `warm_s` (its warm-up, an upper bound)."""
        count = max(self.repeats, min(MAX_REPEATS, math.ceil(MIN_SPAN_S / max(warm_s, 1e-7))))
        if self.group:  # the most any rank wants
            t = torch.tensor([count], dtype=torch.int64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            count = int(t.item())
        return count

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(
        self,
        fn: Callable[[], object],
        repeats: int | None = None,
        *,
        mean: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        share: int = 1,
    ) -> float:
        """Median (or `mean`) seconds of one call of `fn` (one untimed warm-up first). Without
        `repeats`: at least `self.repeats` calls, more for a short call, so that the timed
        calls span `MIN_SPAN_S` (agreed over the ranks: a collective needs as many calls on
        each). `clock`: wall time, or `time.thread_time` for the calling thread's CPU time.
        `share`: the measurement is one of that many sweeps, each timing its share of the
        calls (at least 2; `microbench_attention.ATTENTION_SWEEPS`)."""
        start = time.perf_counter()
        fn()
        self._sync()
        count = repeats or self._repeats_for(time.perf_counter() - start)
        if share > 1:
            count = max(2, math.ceil(count / share))
        if self.group:
            dist.barrier()
        times = []
        for _ in range(count):
            start = clock()
            fn()
            self._sync()
            times.append(clock() - start)
        return statistics.mean(times) if mean else statistics.median(times)
