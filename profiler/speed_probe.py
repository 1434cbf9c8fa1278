"""A reference training step timed when a machine is calibrated and again after each run,
so that a run report can tell a machine that changed speed from a cost model that is wrong.

A calibration is a snapshot: every figure it measures (kernels, dispatch, links) holds for the
machine as it was then. A shared machine does not stay so: on this project's 2-core VM the
per-operator dispatch cost read 4.4 us in one calibration and 8.8 us in another 21 minutes
later, and 12.1 us at a third, and a run's measured step time moves with it (GPT-2 tiny, DDP,
the same plan: 29.6, 37.3, 30.7 ms in three records; 49.9 and 62.6 ms in two runs minutes
apart, 2026-11-26). A GPU's clocks move too (power and thermal limits, another tenant on a
shared node). The probe is a fixed forward and backward of a small MLP: dispatch-bound on a
host CPU (as small models are) with GEMMs the size of a small model's, and GEMM-bound on a
GPU (its width scaled up). Its time against the calibration's says how much faster or slower
the machine ran than the machine the plan was priced for; the report prints the ratio, and
`paraplan calibrate --from-run` leaves that drift out of the time scale it refits.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

LAYERS = 4
"""Linear + GELU pairs of the probe's MLP."""
WIDTH = {"cpu": 128, "cuda": 4096}
"""Width of its Linears and rows of its input, by device type (others use the CPU's)."""
REPEATS = 51
"""Timed steps of `probe_s`."""
SAMPLES_PER_CALL = 5
"""Timed steps of each `SpeedProbe.sample` (about 10 ms on this VM's CPU)."""


class SpeedProbe:
    """The reference step, built once and sampled between a run's steps (or a calibration's
    measurements): the machine's speed drifts within seconds on a shared VM (the step read
    1.4 ms for one tenth of a second and 1.9 ms the next), so samples spread over the whole
    run measure the speed its steps saw, where one measurement at its end would not. fp32,
    seeded, free of collectives."""

    def __init__(self, device: torch.device) -> None:
        width = WIDTH.get(device.type, WIDTH["cpu"])
        gen = torch.Generator().manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(LAYERS):
            linear = nn.Linear(width, width)
            with torch.no_grad():
                linear.weight.copy_(torch.randn(width, width, generator=gen) / width**0.5)
            layers += [linear, nn.GELU()]
        self.device = device
        self._mlp = nn.Sequential(*layers).to(device)
        self._x = torch.randn(width, width, generator=gen).to(device)
        self.samples_s: list[float] = []
        """Wall seconds of each timed reference step so far."""
        self._warm = False

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def sample(self, count: int = SAMPLES_PER_CALL) -> None:
        """Time `count` reference steps (two untimed ones first, the first time)."""
        if not self._warm:
            for _ in range(2):
                self._mlp(self._x).sum().backward()
            self._warm = True
        for _ in range(count):
            self._sync()
            start = time.perf_counter()
            self._mlp(self._x).sum().backward()
            self._sync()
            self.samples_s.append(time.perf_counter() - start)
        self._mlp.zero_grad(set_to_none=True)  # nothing of it held between samples

    def median_s(self) -> float:
        """Median seconds of the samples so far (0 when none)."""
        return statistics.median(self.samples_s) if self.samples_s else 0.0


def probe_s(device: torch.device, repeats: int = REPEATS) -> float:
    """Median wall seconds of `repeats` reference steps (forward, backward) on `device`, in
    one go."""
    probe = SpeedProbe(device)
    probe.sample(repeats)
    return probe.median_s()
