"""The machine a calibration runs on: its name, its load, and how steady its speed is.

A shared virtual machine does not run at one speed. On the 2-vCPU VM this project is built on
(2026-11-28, nothing else running, no steal time reported) a fixed host workload (~25 ms of
256^3 GEMMs and autograd operators) run without pause for a minute took 1.02x its fastest time
at the 10th percentile, 1.07x at the median and 1.26x at the 90th, in spells of 1.4x lasting
about half a second (a neighbour on the host); after a 10 ms sleep its first call took 1.8x,
after 50 ms the next 13 ms of calls 1.3-1.7x (a rank waking from a collective wait pays that);
one fused attention backward in bf16 switched between ~4.5 and ~8 ms in spells of 0.1-1 s; the
same 2-rank FSDP2 plan measured 86 and 132 ms per step in two runs a minute apart. No figure
measured over seconds can take that out of a run measured over seconds; what a calibration can
do is say how large it was while it measured (`SteadinessProbe`), so that a prediction is read
with that margin.
"""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path

import torch

from .host_probe import HostProbe

MIN_SAMPLES = 10
"""Fewer samples than this say nothing about the spread (0 is reported)."""


def device_name(device: torch.device) -> str:
    """The device as torch (CUDA) or the OS (the CPU model in /proc/cpuinfo) names it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def machine_load() -> float:
    """The 1-minute load average now (0 where the OS does not say)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return 0.0


class SteadinessProbe:
    """A fixed host workload, timed again at every progress point of a calibration (a few
    hundred over its minutes, on every rank at about the same moment, as a training step's
    ranks run): how much slower than its fastest it ran is how much this machine's speed
    moved while the figures were measured. Only on a CPU: a GPU's kernels run on its own
    clocks, and its host's jitter hides behind the launch queue."""

    def __init__(self, device: torch.device) -> None:
        self.active = device.type == "cpu"
        self.samples: list[float] = []
        self._probe = HostProbe()

    def sample(self) -> None:
        """Time the workload once more (nothing off a CPU)."""
        if self.active:
            self.samples.append(self._probe.sample_s())

    def spread(self) -> float:
        """The 90th percentile of the samples over their 10th, less 1 (0.4: the slow tenth
        ran 40% slower than the fast tenth); 0 with fewer than `MIN_SAMPLES` samples."""
        return speed_spread(self.samples)


def speed_spread(samples: list[float]) -> float:
    """`SteadinessProbe.spread` of `samples` (seconds of the same workload)."""
    if len(samples) < MIN_SAMPLES:
        return 0.0
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return max(0.0, deciles[8] / deciles[0] - 1.0)
