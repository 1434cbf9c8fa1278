"""`paraplan checkpoint`: a schedule within the budget, the file it writes round-trips, and bad
input (budgets below the minimum, malformed sizes) exits 2 saying what to change."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.cli.common import format_bytes, parse_bytes
from paraplan.planner.hardware import get_accelerator
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.profile_io import save_profile
from paraplan.planner.remat_schedule import (
    CheckpointSchedule,
    RematSolver,
    StepOp,
    load_schedule,
    save_schedule,
)
from paraplan.planner.solvers import (
    Backward,
    Forward,
    chain_from_profile,
    simulate,
    solve_checkpoint_dp,
)
from paraplan.planner.solvers.tradeoff import baseline_schedule

from .profiler_models import HF_TINY

SEQ = 128


def checkpoint(*argv: str) -> int:
    """`paraplan checkpoint ARGV` through the command line's entry point."""
    return main(["checkpoint", *argv])


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2 small's analytic profile at a short sequence, as `paraplan profile -o` writes."""
    path = tmp_path_factory.mktemp("profiles") / "gpt2.json"
    save_profile(PRESETS["gpt2"].to_profile(SEQ), path)
    return path


def chain_for(micro_batch: int = 1):  # type: ignore[no-untyped-def]
    """The chain the command builds from `profile_path` (h100 roofline, bf16)."""
    acc = get_accelerator("h100")
    spf = 1 / (acc.peak_flops_for("bf16") * acc.matmul_efficiency)
    return chain_from_profile(
        PRESETS["gpt2"].to_profile(SEQ), micro_batch_size=micro_batch, seconds_per_flop=spf
    )


def test_schedule_fits_the_budget_and_round_trips(
    capsys, profile_path: Path, tmp_path: Path
) -> None:
    chain = chain_for()
    least = solve_checkpoint_dp(chain, 0.0).min_budget_bytes
    top = simulate(chain, baseline_schedule(chain, "store-all")).peak_bytes
    budget = (least + top) / 2
    out = tmp_path / "schedule.json"
    code = checkpoint("--model", str(profile_path), "--budget", f"{budget:.0f}", "-o", str(out))
    printed = capsys.readouterr().out
    assert code == 0
    assert "solver dp: optimal" in printed and "h100 roofline" in printed
    assert "recompute (" in printed and "store all (" in printed
    assert "over store-all" in printed and f"schedule written to {out}" in printed
    schedule = load_schedule(out)
    assert schedule.peak_bytes <= schedule.budget_bytes == pytest.approx(budget, abs=1)
    assert schedule.min_budget_bytes == pytest.approx(least)
    assert schedule.layers == tuple(x.name for x in chain.layers)
    assert 0 < schedule.overhead < 1
    # The steps are the schedule: replayed they give the recorded peak and time.
    ops = [
        Forward(node=s.layer + 1, keep_saved=s.keep_saved)
        if s.op == "forward"
        else Backward(node=s.layer + 1)
        for s in schedule.steps
    ]
    replay = simulate(chain, ops)
    assert replay.peak_bytes == pytest.approx(schedule.peak_bytes)
    assert replay.makespan_s == pytest.approx(schedule.makespan_s)
    runs = [
        sum(1 for s in schedule.steps if s.op == "forward" and s.layer == i)
        for i in range(len(chain))
    ]
    assert schedule.recomputed == tuple(r - 1 for r in runs)
    # Strict load: re-saving gives the same file; an unknown key is refused.
    save_schedule(schedule, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == out.read_text()
    data = json.loads(out.read_text())
    data["schedule"]["surprise"] = 1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="surprise"):
        load_schedule(tmp_path / "bad.json")


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_budget_below_the_minimum_says_the_smallest_that_works(
    capsys, profile_path: Path, micro_batch: int
) -> None:
    least = solve_checkpoint_dp(chain_for(micro_batch), 0.0).min_budget_bytes
    code = checkpoint(
        "--model", str(profile_path), "--budget", "10MiB", "--micro-batch", str(micro_batch)
    )
    err = capsys.readouterr().err
    assert code == 2
    smallest = format_bytes(least, round_up=True)
    assert f"budget 10.0 MiB is below the smallest feasible peak {smallest}" in err
    size = "1 sequence" if micro_batch == 1 else f"{micro_batch} sequences"
    assert f"for gpt2 (one micro-batch of {size}, seq {SEQ})" in err
    assert ("lower --micro-batch" in err) == (micro_batch > 1)
    # The advice is enough: the budget it names works.
    advised = re.search(r"raise --budget to at least ([0-9.]+ [KMG]iB)", err)
    assert advised is not None
    assert parse_bytes(advised.group(1).replace(" ", "")) >= least
    code = checkpoint(
        "--model",
        str(profile_path),
        "--budget",
        advised.group(1).replace(" ", ""),
        "--micro-batch",
        str(micro_batch),
    )
    assert code == 0, capsys.readouterr().err


def test_ilp_solver_and_everything_fits(capsys, profile_path: Path) -> None:
    chain = chain_for()
    top = simulate(chain, baseline_schedule(chain, "store-all")).peak_bytes
    code = checkpoint(
        "--model", str(profile_path), "--budget", f"{0.8 * top:.0f}", "--solver", "ilp"
    )
    printed = capsys.readouterr().out
    assert code == 0 and "solver ilp:" in printed and "recompute (" in printed
    assert checkpoint("--model", str(profile_path), "--budget", "80GiB") == 0
    assert "everything fits: no layer is recomputed" in capsys.readouterr().out


def test_measured_times_are_used_unless_a_gpu_is_named(capsys, tmp_path: Path) -> None:
    profile = PRESETS["gpt2"].to_profile(SEQ)
    layers = tuple(dataclasses.replace(x, fwd_time_s=1e-3, bwd_time_s=2e-3) for x in profile.layers)
    path = tmp_path / "measured.json"
    save_profile(dataclasses.replace(profile, layers=layers, measured_on="cpu"), path)
    assert checkpoint("--model", str(path), "--budget", "80GiB") == 0
    printed = capsys.readouterr().out
    assert "times measured on cpu" in printed and "42.00 ms" in printed  # 14 layers x 3 ms
    assert checkpoint("--model", str(path), "--budget", "80GiB", "--gpu", "a100-80gb") == 0
    assert "a100-80gb roofline" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("1500MB", 1.5e9),
        ("3.5G", 3.5 * 2**30),
        ("1e9", 1e9),
        ("512 MiB", 512 * 2**20),
        ("2gb", 2e9),
        ("4096", 4096.0),
        ("1_000KB", 1e6),
        (".5T", 2**39),
    ],
)
def test_budget_sizes_parse(text: str, expected: float) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["2XB", "", "GiB", "-1G", "0", "1.2.3G", "2 GiB extra", "nan"])
def test_bad_budget_sizes_are_refused_naming_the_value(
    capsys, profile_path: Path, text: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
        parse_bytes(text)
    with pytest.raises(SystemExit) as info:
        checkpoint("--model", str(profile_path), f"--budget={text}")  # "-1G" is not an option
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --budget" in err and repr(text) in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seq-len", "256"], ["--seq-len 256", "profile's 128"]),
        (["--gpu", "tpu9"], ["tpu9"]),
    ],
)
def test_bad_input_exits_2_naming_it(
    capsys, profile_path: Path, argv: list[str], words: list[str]
) -> None:
    assert checkpoint("--model", str(profile_path), "--budget", "1GiB", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error:")
    for word in words:
        assert word in err


def test_missing_or_foreign_files_exit_2(capsys, tmp_path: Path) -> None:
    assert checkpoint("--model", str(tmp_path / "nope.json"), "--budget", "1GiB") == 2
    assert "nope.json" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert checkpoint("--model", str(other), "--budget", "1GiB") == 2
    assert "other.json" in capsys.readouterr().err


def test_traces_a_hugging_face_config(capsys, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = tmp_path / "gpt2-tiny.json"
    config.write_text(json.dumps(HF_TINY["gpt2"]))
    assert checkpoint("--model", str(config), "--seq-len", "64", "--budget", "1GiB") == 0
    printed = capsys.readouterr().out
    assert "gpt2-tiny: one micro-batch of 1 sequence, seq 64, 4 layers" in printed


# ---- the schedule file (planner.remat_schedule): strict load -------------------------------
@pytest.fixture(scope="module")
def schedule_doc(profile_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A schedule file `paraplan checkpoint -o` wrote, parsed."""
    chain = chain_for()
    least = solve_checkpoint_dp(chain, 0.0).min_budget_bytes
    out = tmp_path_factory.mktemp("schedules") / "s.json"
    assert (
        checkpoint("--model", str(profile_path), "--budget", f"{least * 1.2:.0f}", "-o", str(out))
        == 0
    )
    return json.loads(out.read_text())


def test_schedule_loads_typed(schedule_doc: dict, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(schedule_doc))
    schedule = load_schedule(path)
    assert isinstance(schedule, CheckpointSchedule)
    assert schedule.solver is RematSolver.DP
    assert {s.op for s in schedule.steps} == {StepOp.FORWARD, StepOp.BACKWARD}
    assert any(not s.keep_saved for s in schedule.steps)  # the budget forces recomputation


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("seq_len", 0, ["seq_len", "minimum"]),
        ("status", "infeasible", ["status", "infeasible"]),
        ("solver", "rotor", ["solver", "rotor"]),
        ("peak_bytes", float("nan"), ["peak_bytes", "finite"]),
        ("makespan_s", float("inf"), ["makespan_s", "finite"]),
        ("budget_bytes", 1.0, ["peak_bytes", "exceeds budget_bytes"]),
        ("recomputed", [0], ["recomputed has 1 entries", "14 layers"]),
    ],
)
def test_schedule_load_rejects_bad_values_naming_the_field(
    schedule_doc: dict, tmp_path: Path, field: str, value: object, words: list[str]
) -> None:
    data = json.loads(json.dumps(schedule_doc))
    data["schedule"][field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad\.json") as info:
        load_schedule(path)
    for word in words:
        assert word in str(info.value)


def test_schedule_load_rejects_a_step_on_no_layer(schedule_doc: dict, tmp_path: Path) -> None:
    data = json.loads(json.dumps(schedule_doc))
    data["schedule"]["steps"][3]["layer"] = 14  # gpt2 at this size has layers 0..13
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"steps\.3\.layer = 14 is not a layer index \(0\.\.13\)"):
        load_schedule(path)
