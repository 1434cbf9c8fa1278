"""The host probe a calibration and a CPU run both time (profiler/host_probe.py): it leaves the
global random stream alone, the calibration keeps its median, a run report carries the run's,
and `paraplan calibrate --from-run` reads the two side by side."""

from __future__ import annotations

import statistics

import pytest
import torch

from paraplan.planner.calibration_refit import RunSample, machine_note, run_sample
from paraplan.profiler.host_probe import HostProbe
from paraplan.profiler.microbench_machine import MIN_SAMPLES, SteadinessProbe


def test_probing_leaves_the_global_random_stream_as_it_was() -> None:
    """A run's weights and batches come from the global generator: probing mid-run must not
    draw from it."""
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    probe = HostProbe()
    assert 0 < probe.sample_s() < 1
    assert torch.equal(torch.rand(4), expected)


def test_the_calibration_keeps_the_median_sample() -> None:
    probe = SteadinessProbe(torch.device("cpu"))
    probe.sample()
    assert probe.median_s() == 0.0  # too few samples to say
    for _ in range(MIN_SAMPLES):
        probe.sample()
    assert probe.median_s() == statistics.median(probe.samples) > 0


def _sample(measured_s: float, probe_s: float | None) -> RunSample:
    return RunSample(
        step_time_s=measured_s,
        predicted_step_time_s=1.0,
        peak_memory_bytes=1.0,
        predicted_memory_bytes=1.0,
        host_probe_s=probe_s,
    )


def test_the_refit_reads_the_machine_beside_the_errors() -> None:
    """Probes of 1.1, 1.3 and 0.9 ms against a calibrated 1.0 ms: +10% median, -10% to +30%;
    steps 1.05, 1.25, 0.95 s against 1 s predicted: +5%, -5% to +25% (by hand)."""
    samples = [_sample(1.05, 1.1e-3), _sample(1.25, 1.3e-3), _sample(0.95, 0.9e-3)]
    note = machine_note([*samples, _sample(2.0, None)], 1.0e-3) or ""
    assert "during 3 of these runs" in note
    assert "+10% (median; -10% to +30%)" in note and "+5% (-5% to +25%)" in note
    one = machine_note(samples[1:2], 1.0e-3) or ""
    assert "during the run" in one and "+30%" in one and "+25%" in one and "median" not in one
    assert machine_note(samples, 0.0) is None  # a calibration from before the probe
    assert machine_note([_sample(1.0, None)], 1.0e-3) is None  # a GPU run, or an old report


def test_a_report_s_probe_is_read_and_checked() -> None:
    report = {
        "step_time_s": 1.0,
        "predicted_step_time_s": 1.0,
        "peak_memory_bytes": [1.0],
        "predicted_memory_per_gpu_bytes": 1.0,
    }
    assert run_sample(report, origin="r").host_probe_s is None
    assert run_sample(report | {"host_probe_s": 0.002}, origin="r").host_probe_s == 0.002
    for bad in (0.0, -1.0, float("nan"), "fast", True):
        with pytest.raises(ValueError, match="not a run report"):
            run_sample(report | {"host_probe_s": bad}, origin="r")
