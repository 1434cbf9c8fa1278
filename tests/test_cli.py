"""The `paraplan` command as a new user meets it: the README example, bad input, explain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.planner.hf_presets import HF_PRESETS
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.plan import SCHEMA_VERSION
from paraplan.planner.plan_io import load_plan


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_readme_example_writes_a_valid_plan(capsys, tmp_path: Path) -> None:
    out_path = tmp_path / "p.json"
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "llama3-8b",
        "--cluster",
        "8xh100",
        "--global-batch",
        "256",
        "--seq-len",
        "8192",
        "-o",
        str(out_path),
    )
    assert code == 0, err
    for heading in ("Plan", "Predicted", "Memory per GPU", "Runners-up"):
        assert heading in out
    plan = load_plan(out_path)
    assert plan.feasible and plan.cluster.num_gpus == 8
    assert plan.model.num_params == 8_030_261_248
    assert len(plan.runners_up) == 3


def test_json_on_stdout(capsys) -> None:
    code, out, _ = run(
        capsys, "plan", "--model", "gpt2", "--cluster", "8xh100", "--global-batch", "16", "--json"
    )
    assert code == 0
    assert json.loads(out)["schema_version"] == SCHEMA_VERSION


def test_tokens_batch_form(capsys) -> None:
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "gpt2",
        "--cluster",
        "8xh100",
        "--global-batch-tokens",
        "16K",
        "--seq-len",
        "1024",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["train"]["global_batch"] == 16


def test_model_that_fits_nowhere(capsys) -> None:
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "llama3-405b",
        "--cluster",
        "8xl4",
        "--global-batch",
        "8",
        "--seq-len",
        "8192",
    )
    assert code == 2
    assert "smallest per-GPU memory any plan needs is" in err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--model", "llama3-9b"], ["llama3-9b", "preset"]),
        (["--model", "gpt:layers=2,hidden"], ["'hidden'", "key=value"]),
        (["--model", "gpt:layers=x,hidden=64,heads=4,vocab=10"], ["layers='x'", "integer"]),
        (["--cluster", "8h100"], ["8h100", "<N>x<accelerator>"]),
        (["--cluster", "8xh1000"], ["h1000", "known accelerators"]),
        (["--cluster", "12xh100"], ["12", "multiple of 8"]),
        (["--fix", "tq=2"], ["tq", "keys:"]),
        (["--fix", "tp"], ["'tp'", "key=value"]),
        (["--fix", "schedule=zb"], ["zb", "1f1b"]),
        (["--fix", "tp=5"], ["tp=5", "divide"]),
        (["--fix", "tp=8"], ["tp=8", "heads=12"]),
        (["--fix", "mbs=3"], ["micro_batch_size=3", "divide"]),
    ],
)
def test_bad_input_names_the_token(capsys, args: list[str], needles: list[str]) -> None:
    base = {"--model": "gpt2", "--cluster": "8xh100"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["plan", "--global-batch", "16"]
    for flag, value in base.items():
        argv += [flag, value]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_pinned_infeasible_plan_is_reported(capsys, tmp_path: Path) -> None:
    out_path = tmp_path / "p.json"
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        "8xh100",
        "--global-batch",
        "64",
        "--fix",
        "dp=8,tp=1,pp=1,zero=0,mbs=1,schedule=none,recompute=none",
        "-o",
        str(out_path),
    )
    assert code == 2
    assert "does not fit" in err
    plan = load_plan(out_path)
    assert plan.feasible is False
    assert "GiB per GPU" in plan.infeasible_reason
    assert plan.predicted.memory_per_gpu_bytes > plan.predicted.memory_capacity_bytes
    assert (plan.parallelism.dp, plan.parallelism.tp, plan.parallelism.zero_stage) == (8, 1, 0)


def test_pinned_dimensions_are_respected(capsys) -> None:
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "gpt2",
        "--cluster",
        "8xh100",
        "--global-batch",
        "16",
        "--fix",
        "tp=2,pp=2,schedule=1f1b,recompute=full",
        "--json",
    )
    assert code == 0
    d = json.loads(out)
    assert (d["parallelism"]["tp"], d["parallelism"]["pp"], d["schedule"]) == (2, 2, "1f1b")
    assert {layer["recompute"] for layer in d["layers"] if layer["name"].startswith("block")} == {
        "full"
    }


def test_explain_says_what_bounds_the_plan(capsys, tmp_path: Path) -> None:
    out_path = tmp_path / "p.json"
    assert (
        main(
            [
                "plan",
                "--model",
                "gpt3-175b",
                "--cluster",
                "64xa100-80gb",
                "--global-batch",
                "128",
                "-o",
                str(out_path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, out, _ = run(capsys, "explain", str(out_path))
    assert code == 0
    assert "Memory:" in out and "Time:" in out and "Next best:" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, _, err = run(capsys, "explain", str(bad))
    assert code == 2 and "invalid plan" in err


def test_planner_and_cli_do_not_import_torch() -> None:
    code = (
        "import sys, paraplan.cli, paraplan.planner.search, paraplan.planner.api;"
        "paraplan.cli.build_parser();"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_model_help_names_every_preset(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --help` names every preset `--model` takes, analytic and Hugging Face (it listed
    seven of ten until 2026-11-27)."""
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at hyphens: one line per option
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in {*PRESETS, *HF_PRESETS}:
        assert name in text, name
