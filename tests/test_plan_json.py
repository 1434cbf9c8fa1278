"""The plan JSON: schema agrees with the docs, strict load, exact round trip, atomic write."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import paraplan
from paraplan.planner.plan import Plan
from paraplan.planner.plan_io import load_plan, save_plan
from paraplan.planner.schema import plan_schema

DOCS_SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "plan.schema.json"


@pytest.fixture(scope="module")
def plan() -> Plan:
    return paraplan.plan("gpt2", "8xh100", global_batch=16, seq_len=1024, top_k=2).plan


def test_docs_schema_is_the_generated_one() -> None:
    on_disk = json.loads(DOCS_SCHEMA.read_text())
    assert on_disk == plan_schema(), "docs/plan.schema.json is stale: run `make schema`"
    jsonschema.Draft202012Validator.check_schema(on_disk)


def test_round_trip_is_exact(plan: Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    data = json.loads(path.read_text())
    jsonschema.validate(data, json.loads(DOCS_SCHEMA.read_text()))
    assert load_plan(path) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left behind


def test_required_fields_present(plan: Plan) -> None:
    d = plan.to_dict()
    # v15: multi-token-prediction modules trained; v14: the experts' dispatch and routing
    # groups; v13: MoE layout, latent attention; v12: attention windows; v11: the model's MLP
    assert d["schema_version"] == 15
    assert set(d["parallelism"]) >= {
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "zero_stage",
        "sequence_parallel",
        "virtual_stages",
    }
    assert set(d["predicted"]["memory_breakdown"]) == {
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "other_bytes",
    }
    breakdown = sum(d["predicted"]["memory_breakdown"].values())
    assert breakdown == pytest.approx(d["predicted"]["memory_per_gpu_bytes"])
    # layer ranges cover the chain exactly once, in order
    covered = [
        i
        for st in d["stages"]
        for ch in st["chunks"]
        for i in range(ch["first_layer"], ch["last_layer"] + 1)
    ]
    assert sorted(covered) == list(range(len(d["layers"])))
    p = d["parallelism"]
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == d["cluster"]["num_gpus"]
    assert d["micro_batch_size"] * d["num_microbatches"] * p["dp"] == d["train"]["global_batch"]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d["parallelism"].update(tq=2), "tq"),
        (lambda d: d["parallelism"].update(tp=0), "parallelism.tp"),
        (lambda d: d.update(schedule="zigzag"), "schedule"),
        (lambda d: d["predicted"].pop("mfu"), "mfu"),
        (lambda d: d.update(schema_version=99), "schema_version"),
    ],
)
def test_strict_load_rejects(plan: Plan, tmp_path: Path, mutate, needle: str) -> None:
    data = plan.to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=needle):
        load_plan(path)


def test_malformed_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 1,')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_plan(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_plan(tmp_path / "nope.json")


def test_failed_write_leaves_old_file(plan: Plan, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "plan.json"
    path.write_text("previous")

    def boom(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("paraplan.planner.jsonio.os.replace", boom)
    with pytest.raises(ValueError, match=f"cannot write '{path}': disk full"):
        save_plan(plan, path)
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # the temporary is removed


def test_a_version_10_plan_reads_without_its_mlp(plan: Plan) -> None:
    """Version 10 did not record the model's MLP and routing: such a plan reads as version 11
    with them not recorded (`ffn` 0), and its Megatron export writes what it wrote then (the
    sizes) rather than a guess; a current plan writes the MLP it was planned with."""
    from paraplan.export.megatron import render
    from paraplan.planner.plan_io import plan_from_dict

    doc = json.loads(json.dumps(plan.to_dict()))
    doc["schema_version"] = 10
    for key in ("ffn", "gated_mlp", "top_k", "tied_embeddings"):
        del doc["model"][key]
    old = plan_from_dict(doc)
    assert (old.model.ffn, old.model.gated_mlp, old.model.top_k) == (0, False, 0)
    assert old.predicted == plan.predicted and old.parallelism == plan.parallelism
    assert "--ffn-hidden-size" not in render(old, old.strategy())
    assert plan.model.ffn > 0 and f"--ffn-hidden-size {plan.model.ffn}" in render(
        plan, plan.strategy()
    )
