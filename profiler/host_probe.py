"""A fixed host workload, timed the same way by a calibration and by a run: how fast this
machine was at each moment.

A shared VM does not run at one speed (`microbench_machine`): the calibration times this
workload at every progress point (`Calibration.speed_spread`, how much it moved) and a CPU run
times it after its warm-up steps and after its last step (`RunReport.host_probe_s`).
`paraplan calibrate --from-run` reads the runs' figures against each other: the runs in which
the machine ran slow stand apart. Not against the calibration's: the workload reads 30-40%
faster in a run than between the calibration's microbenchmarks on the same machine (records C
and D of 2026-11-29, whose steps then missed in opposite directions), so the two contexts do
not compare. Nothing happens at import time."""

from __future__ import annotations

import statistics
import time

import torch

PROBE_OPS = 64
"""Tiny operators of the probe's autograd chain (forward and backward): host dispatch, what a
small model's step is made of on a CPU."""
PROBE_GEMM = 128
"""Size of the probe's square GEMM (its kernel part)."""
PROBE_CALLS = 5
"""Calls per sample (about 1 ms each on the CPU above); the sample keeps their median."""
PROBE_WARM_CALLS = 2
"""Untimed calls first: a rank that has just waited (a collective, a barrier) runs slower for
a while, here 1.8x for the first call after a 10 ms sleep and ~1.1x for the next few (2026-11-28,
single process); the samples are of the machine's speed, not of that."""
RUN_SAMPLES = 6
"""Samples a run takes at each of its two points (about 30 ms in all on the CPU above)."""


class HostProbe:
    """The workload: `PROBE_OPS` scalar multiplies and their backward, and a `PROBE_GEMM`^3
    GEMM, on the calling thread. Its inputs come from a generator of its own, so that probing
    leaves the global random stream (a run's weights and data) as it was."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self._a = torch.rand(PROBE_GEMM, PROBE_GEMM, generator=g)
        self._w = torch.ones(1, requires_grad=True)

    def _unit(self) -> None:
        y = self._w
        for _ in range(PROBE_OPS):
            y = y * 1.0
        y.sum().backward()
        torch.mm(self._a, self._a)

    def sample_s(self) -> float:
        """Seconds of one call: the median of `PROBE_CALLS` timed calls after
        `PROBE_WARM_CALLS` untimed ones."""
        for _ in range(PROBE_WARM_CALLS):
            self._unit()
        times = []
        for _ in range(PROBE_CALLS):
            start = time.perf_counter()
            self._unit()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
