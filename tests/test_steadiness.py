"""How steady the machine was while it was calibrated (`profiler/microbench_machine.py`): the
spread against numpy's percentiles, the probe's samples, the field through the cluster file
(older files read as not measured), and `paraplan plan`'s note on an unsteady calibration."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from paraplan.planner.calibration import STEADY_SPREAD, calibration_from_dict
from paraplan.planner.cluster import cluster_from_dict, load_cluster_file, save_cluster_file
from paraplan.profiler.host_probe import PROBE_CALLS
from paraplan.profiler.microbench_machine import MIN_SAMPLES, SteadinessProbe, speed_spread
from tests.test_calibration import _calibration, _cluster_dict


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spread_is_the_ninetieth_over_the_tenth_percentile(seed: int) -> None:
    """Against numpy's linear-interpolation percentiles of the same samples."""
    samples = list(np.random.default_rng(seed).lognormal(-7.0, 0.3, size=37))
    p10, p90 = np.percentile(samples, [10, 90])
    assert speed_spread(samples) == pytest.approx(p90 / p10 - 1, rel=1e-12)


def test_too_few_or_equal_samples_say_nothing() -> None:
    assert speed_spread([1e-3, 2e-3] * ((MIN_SAMPLES - 1) // 2)) == 0.0
    assert speed_spread([1e-3] * 40) == 0.0
    # a machine slow a fifth of the time: the slow tenth ran twice as long as the fast tenth
    assert speed_spread([1e-3] * 40 + [2e-3] * 10) == pytest.approx(1.0)


def test_the_probe_times_its_workload_on_a_cpu_only() -> None:
    probe = SteadinessProbe(torch.device("cpu"))
    for _ in range(MIN_SAMPLES):
        probe.sample()
    assert len(probe.samples) == MIN_SAMPLES and all(0 < s < 1 for s in probe.samples)
    assert probe.spread() >= 0.0
    gpu = SteadinessProbe(torch.device("cuda"))  # built without touching CUDA
    gpu.sample()
    assert gpu.samples == [] and gpu.spread() == 0.0
    assert PROBE_CALLS >= 3  # a median of calls per sample


@pytest.mark.parametrize(("field", "value"), [("speed_spread", 0.42)])
def test_the_machine_figures_go_through_the_cluster_file(
    tmp_path: Path, field: str, value: float
) -> None:
    """The steadiness spread and the host probe's median: saved and read back; 0 in a file
    from before them (the spread before 2026-11-28, the probe before 2026-11-29); >= 0."""
    cal = dataclasses.replace(_calibration(), **{field: value})
    save_cluster_file(cluster_from_dict(_cluster_dict(cal)), tmp_path / "cal.yaml")
    again = load_cluster_file(tmp_path / "cal.yaml").calibration
    assert again is not None and getattr(again, field) == value
    older = _calibration().to_dict()
    del older[field]
    assert getattr(calibration_from_dict(older), field) == 0.0
    with pytest.raises(ValueError, match=rf"{field}=-0\.1 must be >= 0"):
        dataclasses.replace(_calibration(), **{field: -0.1})


def test_only_an_unsteady_calibration_is_noted() -> None:
    assert dataclasses.replace(_calibration(), speed_spread=STEADY_SPREAD).unsteady_note() is None
    note = dataclasses.replace(_calibration(), speed_spread=0.42).unsteady_note() or ""
    assert "up to 42% longer" in note and "AMD EPYC" in note and "--from-run" in note


def test_plan_notes_an_unsteady_calibration(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    for spread, noted in ((0.05, False), (0.93, True)):
        cal = dataclasses.replace(_calibration(), speed_spread=spread)
        path.write_text(json.dumps(_cluster_dict(cal)))
        done = subprocess.run(
            [
                *(sys.executable, "-m", "paraplan", "plan", "--cluster", str(path)),
                *("--model", "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64"),
                *("--global-batch", "8", "--precision", "fp32", "--no-progress"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert ("note: this machine's speed moved" in done.stderr) is noted
        assert ("up to 93% longer" in done.stderr) is noted


def test_a_timer_sweep_times_its_share_of_the_calls() -> None:
    """`Timer(share=k)`: one untimed warm-up, then the measurement's calls divided among k
    sweeps (rounded up, at least 2); counted on the callable itself."""
    from paraplan.profiler.microbench_timer import Timer

    calls = [0]

    def fn() -> None:
        calls[0] += 1

    timer = Timer(torch.device("cpu"), 5, group=False)
    for repeats, share, timed in ((9, 1, 9), (9, 3, 3), (10, 3, 4), (3, 3, 2), (6, 3, 2)):
        calls[0] = 0
        assert timer(fn, repeats, share=share) >= 0.0
        assert calls[0] == 1 + timed, (repeats, share)


def test_the_attention_curve_averages_its_sweeps() -> None:
    """A small curve measured for real: one rate per head size and length, all positive, on
    the FLOPs grid the planner interpolates on."""
    from paraplan.profiler.microbench_attention import ATTENTION_SWEEPS, attention_curve
    from paraplan.profiler.microbench_cold import ColdPool
    from paraplan.profiler.microbench_timer import Timer

    assert ATTENTION_SWEEPS >= 3
    timer = Timer(torch.device("cpu"), 3, group=False)
    pool = ColdPool(torch.float32, torch.device("cpu"), nbytes=8 * 2**20)
    curve = attention_curve(timer, torch.float32, (16, 32), (16, 64), pool)
    assert curve.dense_fwd_flops == (4.0 * 256 * 16**2, 4.0 * 256 * 32**2)
    assert len(curve.fwd_flops_per_s) == len(curve.bwd_flops_per_s) == 4
    assert all(r > 0 for r in curve.fwd_flops_per_s + curve.bwd_flops_per_s)
