"""A plan made from a traced module carries its digest; the executor refuses another module
before anything distributed happens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from paraplan.cli import main
from paraplan.executor.checks import check_module_digest
from paraplan.planner.plan_io import load_plan
from paraplan.profiler.hf import build_model, load_config

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "gpt2-tiny.json"


def test_plan_records_digest_and_executor_checks_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "plan",
                "--model",
                str(CONFIG),
                "--cluster",
                "2xcpu",
                "--global-batch",
                "8",
                "--seq-len",
                "64",
                "-o",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    capsys.readouterr()
    plan = load_plan(out)
    assert len(plan.model.module_digest) == 16
    same = build_model(load_config(str(CONFIG)), device="cpu")  # fp32 on CPU: still the same
    check_module_digest(plan, same)
    data = json.loads(CONFIG.read_text())
    other = build_model(load_config(data | {"n_inner": 4 * data["n_embd"] + 8}), device="cpu")
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        check_module_digest(plan, other)
