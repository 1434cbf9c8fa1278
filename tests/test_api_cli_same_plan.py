"""The CLI and the Python API read a model string the same way (one default model source:
`auto`, which traces Hugging Face presets), so the same inputs give the same plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import paraplan
from paraplan.cli import main


def test_cli_and_api_give_the_same_plan_for_the_same_inputs(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["--model", "gpt2", "--cluster", "8xh100", "--global-batch", "16", "--seq-len", "1024"]
    assert main(["plan", *args, "--no-progress", "-o", str(out)]) == 0
    cli = json.loads(out.read_text())
    api = paraplan.plan("gpt2", "8xh100", global_batch=16, seq_len=1024).plan.to_dict()
    for key in ("model", "parallelism", "mesh", "schedule", "predicted"):
        assert cli[key] == api[key], key
    # the traced profile, not the analytic spec: the spec of the same preset differs
    spec = paraplan.plan("gpt2", "8xh100", global_batch=16, seq_len=1024, model_source="spec")
    assert spec.plan.model.module_digest == "" and cli["model"]["module_digest"] != ""
