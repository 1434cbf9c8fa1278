"""The host probe a calibration and a CPU run both time (profiler/host_probe.py): it leaves the
global random stream alone, a run report carries the run's figure, and `paraplan calibrate
--from-run` sets apart the runs that ran on a slow machine."""

from __future__ import annotations

import pytest
import torch

from paraplan.planner.calibration_refit import RunSample, machine_note, run_sample
from paraplan.profiler.host_probe import HostProbe


def test_probing_leaves_the_global_random_stream_as_it_was() -> None:
    """A run's weights and batches come from the global generator: probing mid-run must not
    draw from it."""
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    probe = HostProbe()
    assert 0 < probe.sample_s() < 1
    assert torch.equal(torch.rand(4), expected)


def _sample(measured_s: float, probe_s: float | None) -> RunSample:
    return RunSample(
        step_time_s=measured_s,
        predicted_step_time_s=1.0,
        peak_memory_bytes=1.0,
        predicted_memory_bytes=1.0,
        host_probe_s=probe_s,
    )


def test_the_refit_sets_the_slow_runs_apart() -> None:
    """Probes of 1.0, 1.1, 0.9 and 2.0 ms (median 1.05): the 2.0 ms run is over 1.2x it, its
    step +30% against the others' +5, -5 and +10% (median +5%), by hand."""
    samples = [_sample(1.05, 1.0e-3), _sample(0.95, 1.1e-3), _sample(1.10, 0.9e-3)]
    note = machine_note([*samples, _sample(1.30, 2.0e-3), _sample(9.0, None)]) or ""
    assert "slow in 1 of these runs" in note and "each of 4 runs, took 1.05 ms" in note
    assert "+30% (median), the other runs' +5%" in note
    steady = machine_note(samples) or ""
    assert "ran alike" in steady and "1.00 ms" in steady
    assert machine_note(samples[:1]) is None  # nothing to compare with
    assert machine_note([_sample(1.0, None), _sample(1.0, None)]) is None  # GPU runs, old reports


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
