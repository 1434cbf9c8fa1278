"""`paraplan profile` and planning from traced models, as a user meets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.planner.profile_io import load_profile

from .profiler_models import HF_TINY


@pytest.fixture
def llama_config(tmp_path: Path) -> Path:
    path = tmp_path / "llama-tiny.json"
    path.write_text(json.dumps(HF_TINY["llama"]))
    return path


def test_profile_then_plan_from_it(capsys, tmp_path: Path, llama_config: Path) -> None:
    out = tmp_path / "profile.json"
    code = main(
        [
            "profile",
            "--model",
            str(llama_config),
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--mode",
            "measure",
            "-o",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "block.0..1" in printed or "block.0" in printed
    prof = load_profile(out)
    assert prof.measured_on == "cpu" and prof.num_blocks == 2
    code = main(
        ["plan", "--profile", str(out), "--cluster", "2xcpu", "--global-batch", "8", "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["model"]["num_params"] == prof.num_params
    assert plan["model"]["fingerprint"] == prof.fingerprint()


def test_plan_traces_a_config_file(capsys, llama_config: Path) -> None:
    code = main(
        [
            "plan",
            "--model",
            str(llama_config),
            "--cluster",
            "2xcpu",
            "--global-batch",
            "8",
            "--seq-len",
            "32",
            "--json",
            "--no-progress",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    plan = json.loads(captured.out)
    assert plan["model"]["name"] == "llama-tiny"


def test_preset_traced_and_analytic_agree(capsys) -> None:
    # The same network two ways: traced from its Hugging Face config, and by its sizes.
    plans = {}
    for source in ("trace", "spec"):
        pins = "dp=8,tp=1,pp=1,zero=3,mbs=1,schedule=none,recompute=full"
        code = main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--model-source",
                source,
                "--cluster",
                "8xh100",
                "--global-batch",
                "64",
                "--seq-len",
                "2048",
                "--json",
                "--fix",
                pins,
            ]
        )
        assert code == 0
        plans[source] = json.loads(capsys.readouterr().out)
    traced, analytic = plans["trace"], plans["spec"]
    assert traced["model"]["num_params"] == analytic["model"]["num_params"] == 8_030_261_248
    step_t, step_a = (p["predicted"]["step_time_s"] for p in (traced, analytic))
    assert step_t == pytest.approx(step_a, rel=0.05)


def test_profile_rejects_non_hf_model(capsys) -> None:
    assert main(["profile", "--model", "gpt:layers=2,hidden=64,heads=4,vocab=100"]) == 2
    assert "Hugging Face" in capsys.readouterr().err


def test_plan_profile_seq_mismatch(capsys, tmp_path: Path, llama_config: Path) -> None:
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "profile",
                "--model",
                str(llama_config),
                "--seq-len",
                "32",
                "-o",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "plan",
            "--profile",
            str(out),
            "--cluster",
            "2xcpu",
            "--global-batch",
            "8",
            "--seq-len",
            "64",
        ]
    )
    assert code == 2 and "--seq-len 64" in capsys.readouterr().err
