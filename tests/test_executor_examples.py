"""The examples end to end, as the issue's acceptance runs them: plan a Hugging Face config on
2 CPU ranks, launch the training script under torchrun with the plan (what `paraplan run`
does), and read the printed run report and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from paraplan.cli import main as paraplan_main
from paraplan.executor.launch import run_plan
from paraplan.planner.plan_io import load_plan
from tests.executor_helpers import ROOT

CONFIGS = ROOT / "examples" / "configs"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("script", "config", "fix"),
    [
        ("train_gpt2.py", "gpt2-tiny.json", None),
        ("train_llama.py", "llama-tiny.json", "cp=2"),  # ring attention (TP+SP: numerics)
        ("train_mixtral.py", "mixtral-tiny.json", "ep=2"),  # experts over 2 ranks
    ],
)
def test_plan_then_run_prints_report(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], script: str, config: str, fix: str | None
) -> None:
    plan_path, report_path = tmp_path / "p.json", tmp_path / "report.json"
    argv = [
        "plan",
        "--model",
        str(CONFIGS / config),
        "--cluster",
        "2xcpu",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "-o",
        str(plan_path),
        "--no-progress",
    ]
    assert paraplan_main(argv + (["--fix", fix] if fix else [])) == 0
    plan = load_plan(plan_path)
    for key, value in (kv.split("=") for kv in (fix or "").split(",") if kv):
        assert getattr(plan.parallelism, key) == int(value)  # the strategy that runs
    script_argv = [
        str(ROOT / "examples" / script),
        "--model",
        str(CONFIGS / config),
        "--steps",
        "5",
        "--report",
        str(report_path),
    ]
    if fix is None:  # the command: paraplan run p.json -- script ...
        code = paraplan_main(["run", str(plan_path), "--", *script_argv])
    else:  # the launcher the command calls
        code = run_plan(plan_path, script_argv[0], script_argv[1:])
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    assert "paraplan run report" in out and "step time (median)" in out
    report = json.loads(report_path.read_text())
    # 5 steps: 2 warm-up, 2 timed, the last one profiled for host memory (not timed)
    assert report["world_size"] == 2 and report["steps_timed"] == 2
    assert "glibc" in report["memory_source"]
    # the RSS holds the live bytes and whatever freed heap glibc kept on top
    pairs = zip(report["peak_rss_bytes"], report["peak_memory_bytes"], strict=True)
    assert all(rss >= live * 0.99 for rss, live in pairs), report
    assert report["predicted_step_time_s"] == plan.predicted.step_time_s
    assert report["step_time_s"] > 0 and len(report["peak_memory_bytes"]) == 2
    assert len(report["losses"]) == 5 and report["losses"][-1] < report["losses"][0]
    # the calibration's host workload, timed after the warm-up and after the last step: well
    # under a millisecond to a few on this CPU (profiler/host_probe.py)
    assert 1e-5 < report["host_probe_s"] < 0.1
