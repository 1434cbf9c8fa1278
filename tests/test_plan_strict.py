"""Strict plan load: values are checked, not only types (through the CLI, exit 2, the field
named); typed round trip; enum lists in the schema come from the enums. (The atomic writer's
tests are in test_outputs.py.)"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

import paraplan
from paraplan.cli import main
from paraplan.planner.config import Optimizer, Precision
from paraplan.planner.cost.estimate import TimeBreakdown
from paraplan.planner.cost.memory import MemoryBreakdown
from paraplan.planner.jsonio import object_schema
from paraplan.planner.plan import Plan
from paraplan.planner.plan_io import load_plan, save_plan
from paraplan.planner.schema import plan_schema
from paraplan.planner.strategy import MeshAxis, Recompute, Schedule

Doc = dict[str, Any]


@pytest.fixture(scope="module", params=[None, "pp=2,tp=2"], ids=["dp", "dp-pp-tp"])
def plan(request: pytest.FixtureRequest) -> Plan:
    """Plans on two nodes, with runners-up: data parallel only, and dp=4 x pp=2 x tp=2 with
    interleaved chunks."""
    fix = request.param
    return paraplan.plan("gpt2", "16xh100", global_batch=32, seq_len=1024, fix=fix, top_k=2).plan


@pytest.fixture
def doc(plan: Plan) -> Doc:
    return copy.deepcopy(plan.to_dict())


def _axis(d: Doc, name: str) -> int:
    return int(d["mesh"]["axis_order"].index(name))


def _swap_mesh_sizes(d: Doc) -> None:
    """Sizes that multiply to the world size but sit on the wrong axes."""
    shape = d["mesh"]["shape"]
    i, j = _axis(d, "dp"), _axis(d, "tp")
    shape[i], shape[j] = shape[j], shape[i]


def _double_dp(d: Doc) -> None:
    """dp and its mesh size doubled together: the degrees no longer match the world size."""
    d["parallelism"]["dp"] *= 2
    d["mesh"]["shape"][_axis(d, "dp")] *= 2
    d["train"]["global_batch"] *= 2  # keep the batch arithmetic right


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def mutate(d: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = d
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return mutate


BAD: list[tuple[str, Callable[[Doc], None], str]] = [
    # zero and negative counts
    ("zero gpus", _set("cluster.num_gpus", 0), "cluster.num_gpus"),
    ("zero nodes", _set("cluster.num_nodes", 0), "cluster.num_nodes"),
    ("negative gpus per node", _set("cluster.gpus_per_node", -8), "cluster.gpus_per_node"),
    ("zero batch", _set("train.global_batch", 0), "train.global_batch"),
    ("negative seq_len", _set("train.seq_len", -1024), "train.seq_len"),
    ("zero dp", _set("parallelism.dp", 0), "parallelism.dp"),
    ("negative pp", _set("parallelism.pp", -2), "parallelism.pp"),
    ("zero micro-batch", _set("micro_batch_size", 0), "micro_batch_size"),
    ("zero micro-batches", _set("num_microbatches", 0), "num_microbatches"),
    ("zero mesh size", _set("mesh.shape.0", 0), "mesh.shape.0"),
    # not finite (Python's json writes and reads NaN and Infinity)
    ("nan mfu", _set("predicted.mfu", float("nan")), "predicted.mfu"),
    ("inf comm", _set("predicted.time_breakdown.comm_s", float("inf")), "comm_s"),
    ("-inf params", _set("predicted.memory_breakdown.params_bytes", -float("inf")), "params"),
    ("nan runner", _set("runners_up.0.step_time_s", float("nan")), "runners_up.0.step_time_s"),
    # negative figures, zero capacity and step time
    ("negative bytes", _set("predicted.memory_breakdown.grads_bytes", -1.0), "grads_bytes"),
    ("negative seconds", _set("layers.1.recompute_s", -0.5), "layers.1.recompute_s"),
    ("zero capacity", _set("predicted.memory_capacity_bytes", 0.0), "memory_capacity_bytes"),
    ("zero step time", _set("predicted.step_time_s", 0.0), "predicted.step_time_s"),
    # issue 14: `show` drew a 6e10-character bar (memory 0) and overflowed (1e308)
    ("zero memory", _set("predicted.memory_per_gpu_bytes", 0.0), "memory_per_gpu_bytes"),
    ("memory not its sum", _set("predicted.memory_per_gpu_bytes", 1.0), "memory_per_gpu_bytes"),
    ("1e308 params", _set("predicted.memory_breakdown.params_bytes", 1e308), "params_bytes"),
    ("1e308 tokens/s", _set("predicted.tokens_per_s", 1e308), "predicted.tokens_per_s"),
    ("huge gpu count", _set("cluster.num_gpus", 10**40), "cluster.num_gpus"),
    ("huge batch", _set("train.global_batch", 2**40), "train.global_batch"),
    ("huge seq_len", _set("train.seq_len", 2**40), "train.seq_len"),
    # the mesh against itself, the degrees and the cluster
    ("short mesh", lambda d: d["mesh"]["shape"].pop(), "mesh.shape"),
    ("repeated axis", _set("mesh.axis_order.0", "tp"), "mesh.axis_order"),
    ("sizes on wrong axes", _swap_mesh_sizes, "mesh.shape"),
    ("world size", _double_dp, "cluster.num_gpus"),
    ("nodes x gpus", _set("cluster.gpus_per_node", 4), "cluster.num_gpus"),
    # stages, layers, batch arithmetic
    ("stages", lambda d: d["stages"].pop(), "stages"),
    ("per_layer on a layer", _set("layers.1.recompute", "per_layer"), "layers.1.recompute"),
    ("chunks miss a layer", _set("stages.0.chunks.0.last_layer", 0), "stages"),
    ("layers out of order", _set("layers.1.index", 2), "layers.1.index"),
    ("chunk numbering", _set("stages.0.chunks.0.chunk", 1), "stages.0.chunks.0.chunk"),
    ("batch", _set("train.global_batch", 33), "train.global_batch"),
]


@pytest.mark.parametrize(("mutate", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_cli_refuses_bad_plan(capsys, doc: Doc, tmp_path: Path, mutate, field: str) -> None:
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))  # allow_nan: NaN/Infinity tokens, as a careless writer would
    for command in ("show", "explain"):
        code = main([command, str(path)])
        out, err = capsys.readouterr()
        assert code == 2, (command, out)
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert field in lines[0] and str(path) in lines[0], lines[0]


def test_bad_numbers_in_the_text(doc: Doc, tmp_path: Path) -> None:
    """1e999 parses to inf and NaN is a token JSON does not have: both refused by their path."""
    path = tmp_path / "bad.json"
    text = json.dumps(doc)
    for token, shown in (("1e999", "inf"), ("NaN", "nan"), ("-Infinity", "-inf")):
        path.write_text(re.sub(r'"mfu": [0-9.e-]+', f'"mfu": {token}', text, count=1))
        with pytest.raises(ValueError, match=rf"predicted\.mfu: {shown} is not a finite number"):
            load_plan(path)


def test_messages_name_rule_and_fix(doc: Doc, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    assert doc["parallelism"]["dp"] != doc["parallelism"]["tp"]
    _swap_mesh_sizes(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        load_plan(path)
    text = str(err.value)
    first = min(("dp", "tp"), key=lambda a: _axis(doc, a))
    degree = doc["parallelism"][first]
    assert f"mesh axis '{first}'" in text and f"parallelism.{first}={degree}" in text
    assert "paraplan plan -o" in text  # the fix


def test_good_plan_loads(capsys, plan: Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert main(["show", str(path)]) == 0
    assert f"dp({plan.parallelism.dp})" in capsys.readouterr().out


def test_round_trip_keeps_types(plan: Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    back = load_plan(path)
    assert back == plan
    assert type(back.schedule) is Schedule
    assert type(back.recompute_policy) is Recompute
    assert type(back.train.precision) is Precision and type(back.train.optimizer) is Optimizer
    assert all(type(a) is MeshAxis for a in back.mesh.axis_order)
    assert all(type(d.recompute) is Recompute for d in back.layers)
    assert type(back.predicted.memory_breakdown) is MemoryBreakdown
    assert type(back.predicted.time_breakdown) is TimeBreakdown
    r = back.runners_up[0]
    assert type(r.schedule) is Schedule and type(r.recompute) is Recompute
    assert all(type(a) is MeshAxis for a in r.mesh_axis_order)
    on_disk = json.loads(path.read_text())
    assert on_disk["schedule"] in [e.value for e in Schedule]
    assert on_disk["train"]["precision"] == "bf16"  # paraplan.plan's default


def test_schema_enums_come_from_the_enums() -> None:
    props = plan_schema()["properties"]
    values = lambda enum: [e.value for e in enum]  # noqa: E731
    assert props["schedule"]["enum"] == values(Schedule)
    assert props["recompute_policy"]["enum"] == values(Recompute)
    assert props["train"]["properties"]["precision"]["enum"] == values(Precision)
    assert props["train"]["properties"]["optimizer"]["enum"] == values(Optimizer)
    assert props["mesh"]["properties"]["axis_order"]["items"]["enum"] == values(MeshAxis)
    layer = props["layers"]["items"]["properties"]["recompute"]
    assert layer["enum"] == [v for v in values(Recompute) if v != "per_layer"]
    runner = props["runners_up"]["items"]["properties"]
    assert runner["schedule"]["enum"] == values(Schedule)
    assert runner["recompute"]["enum"] == values(Recompute)
    assert runner["mesh_axis_order"]["items"]["enum"] == values(MeshAxis)
    breakdown = props["predicted"]["properties"]["memory_breakdown"]
    assert breakdown["properties"]["params_bytes"]["description"].startswith("Working param")


class _Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Thing:
    """A thing."""

    colour: _Colour
    """Its colour."""
    colours: tuple[_Colour, ...]
    """More colours."""


def test_object_schema_turns_any_enum_into_its_values() -> None:
    props = object_schema(_Thing)["properties"]
    assert props["colour"] == {"enum": ["red", "blue"], "description": "Its colour."}
    assert props["colours"]["items"] == {"enum": ["red", "blue"]}
