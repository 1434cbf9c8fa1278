"""Issue 16's CLI polish: cheap arguments refused before torch is imported, "did you mean"
instead of long lists, one memory unit (GiB), unambiguous micro-batch wording, exact ties of
the runners-up folded into one row."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import paraplan
from paraplan.cli import main
from paraplan.planner.explain import format_plan
from paraplan.planner.units import GIB

SPEC = "gpt:layers=4,hidden=256,heads=4,vocab=1024,seq=128"


def test_bad_fix_is_refused_before_torch_is_imported() -> None:
    """`--fix tp=3` on 8 GPUs breaks the world-size rule: exit 2 with the rule named, and
    torch never imported (the model is a Hugging Face preset that would otherwise be traced)."""
    code = (
        "import sys\n"
        "from paraplan.cli import main\n"
        "rc = main(['plan', '--model', 'llama3-8b', '--cluster', '8xh100', '--global-batch', "
        "'64', '--fix', 'tp=3', '--no-progress'])\n"
        "print('RESULT', rc, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "RESULT 2 False" in done.stdout, done.stdout + done.stderr
    assert "tp must divide the 8 GPUs" in done.stderr and "rule world_size" in done.stderr


def test_unknown_preset_suggests_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--model", "llama3-8bb", "--cluster", "8xh100", "--global-batch", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean llama3-8b" in err


def test_unknown_model_type_suggests_close_names_not_the_whole_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "lama", "num_hidden_layers": 2}))
    args = ["plan", "--model", str(config), "--cluster", "8xh100", "--global-batch", "8"]
    rc = main([*args, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean llama" in err
    assert "bert-generation" not in err and len(err) < 400  # not transformers' ~700 names


def test_plan_prints_gib_and_micro_batches_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """An 80 GB H100 is 80 GiB: with 10% headroom 72.00 GiB usable (a decimal GB would say
    77.31); no decimal GB figure anywhere in the table."""
    rc = main(["plan", "--model", SPEC, "--cluster", "8xh100", "--global-batch", "64"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "of 72.00 GiB usable" in out
    assert " GB" not in out.replace("'80 GB' GPU", "")
    assert "micro-batch" in out and " of " in out.split("micro-batch")[1].split("\n")[0]
    assert "per GPU)" in out  # tokens/s per GPU beside the total


def test_exact_ties_collapse_into_one_row() -> None:
    outcome = paraplan.plan(SPEC, "8xh100", global_batch=64, top_k=3)
    plan = outcome.plan
    first, *rest = plan.runners_up
    pr = plan.predicted
    tie_with_plan = dataclasses.replace(
        first, step_time_s=pr.step_time_s, memory_per_gpu_bytes=pr.memory_per_gpu_bytes
    )
    twin = dataclasses.replace(first, micro_batch_size=first.micro_batch_size + 100)
    tied = dataclasses.replace(plan, runners_up=(tie_with_plan, first, twin, *rest))
    text = format_plan(tied)
    rows = [line for line in text.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == 1 + len(rest)  # the plan's tie and the twin have no row of their own
    assert f"equivalent to the plan under the cost model: {tie_with_plan.strategy().short()}" in (
        text
    )
    assert f"(equivalent: {twin.strategy().short()})" in text
    assert f"{first.memory_per_gpu_bytes / GIB:>8.1f}" in rows[0]


AMBIGUOUS = re.compile(r"micro-batch(es)? \{|micro-batch(es)? \d+ x \d+")
"""A micro-batch figure with no unit: "micro-batch {b}", "micro-batch 8 x 1"."""


def test_micro_batches_are_counted_in_sequences(tmp_path: Path) -> None:
    from paraplan.export.judge import read_config
    from paraplan.planner.model_parse import parse_model
    from paraplan.planner.solvers import chain_from_profile

    profile = parse_model(SPEC).to_profile(128, act_bytes=2)
    chain = chain_from_profile(profile, micro_batch_size=2, seconds_per_flop=1e-12)
    assert chain.name.endswith("(one micro-batch of 2 sequences)")
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}')
    with pytest.raises(ValueError, match=r"32 sequences \(8 data-parallel ranks x micro-batches "):
        read_config(str(config), world_size=8)
    root = Path(__file__).resolve().parents[1]
    sources = [*root.glob("paraplan/**/*.py"), *root.glob("planner/**/*.py"), root / "README.md"]
    found = [
        f"{p.relative_to(root)}:{n}: {line.strip()}"
        for p in sources
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if AMBIGUOUS.search(line)
    ]
    assert not found, "micro-batch figures without their unit:\n" + "\n".join(found)


@pytest.mark.multiprocess
def test_the_console_command_ends_without_finalization_noise(tmp_path: Path) -> None:
    """`python -m paraplan calibrate` (the console entry, no argv): its stderr holds the
    busy-machine warning at most, not nanobind's leak report that `gc.freeze()` at exit
    caused (27 lines after every calibration and traced plan, until 2026-11-26), and the
    file it wrote is whole."""
    out = tmp_path / "cal.yaml"
    args = ["calibrate", "--cluster", "1xcpu", "-o", str(out), "--quick", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "paraplan", *args, "--dtypes", "fp32"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and "nanobind" not in done.stderr, done.stderr
    assert done.stdout.rstrip().endswith(f"plan with --cluster {out}")
    assert out.exists() and "calibration:" in out.read_text()
