"""Sliding-window attention through the plan and the exports: the plan records each block's
window (`ModelInfo.attention_windows`), the Megatron-LM export writes it as megatron-core
reads it (checked by megatron-core's own `is_layer_window_attention` on the written file),
reading a Megatron file back states its windows, and a configuration whose windows are not
the model's is refused as another model's."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from paraplan.api import plan as make
from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.megatron import read
from paraplan.export.megatron_windows import window_args
from paraplan.export.setup import ModelSays
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan import Plan
from paraplan.planner.plan_io import plan_from_dict
from tests.export_cases import run_loaders

SPEC = "llama:layers=6,hidden=256,heads=4,vocab=100,sliding_window=64"
SEQ = 256
CLUSTER = "8xh100"
JOB = f"--seq-length {SEQ} --micro-batch-size 1 --global-batch-size 8"
"""The batch a Megatron argument file must state beside its model."""


def _plan(spec: str) -> tuple[Plan, Costing]:
    profile = parse_model(spec).to_profile(seq_len=SEQ)
    plan = make(profile, CLUSTER, global_batch=16, fix="tp=2,pp=1,dp=4", top_k=0).plan
    return plan, Costing(profile, parse_cluster(CLUSTER), plan)


def _megatron_windows(text: str, tmp: Path, world: int = 8) -> list[int]:
    path = tmp / "windows.args"
    path.write_text(text)
    return run_loaders("megatron", [{"path": str(path), "world_size": world, "dp": 4}])[0][
        "windows"
    ]


def test_plan_records_the_windows_the_profile_prices() -> None:
    """Every third block attends to the whole sequence (`full_attention_every=3`), the rest to
    64 keys: the plan's windows are the profile's, block by block; a window as long as the
    sequence is none; a model without windows records none."""
    plan, _ = _plan(SPEC + ",full_attention_every=3")
    assert plan.model.attention_windows == (64, 64, 0, 64, 64, 0)
    assert plan.model.windowed
    long, _ = _plan(SPEC.replace("=64", f"={SEQ}"))
    assert long.model.attention_windows == () and not long.model.windowed
    plain, _ = _plan("llama:layers=6,hidden=256,heads=4,vocab=100")
    assert plain.model.attention_windows == ()
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.model.attention_windows == plan.model.attention_windows


def test_version_11_plans_read_without_windows() -> None:
    plan, _ = _plan(SPEC)
    doc = plan.to_dict()
    doc["schema_version"] = 11
    del doc["model"]["attention_windows"]
    assert plan_from_dict(doc).model.attention_windows == ()
    for bad in ([64, 64], [0] * 6):  # one per block, and only where some block has one
        doc = plan.to_dict()
        doc["model"]["attention_windows"] = bad
        with pytest.raises(ValueError, match=re.escape("invalid plan at model.attention_windows")):
            plan_from_dict(doc)


@pytest.mark.parametrize(
    ("windows", "flags"),
    [
        ((64,) * 6, ["--window-size 63,0"]),
        ((64, 64, 0) * 2, ["--window-size 63,0", "--window-attn-skip-freq 3"]),
        ((64, 0, 0, 64, 64, 0), ["--window-size 63,0", "--window-attn-skip-freq [1,0,0,1,1,0]"]),
        ((), []),
    ],
)
def test_megatron_export_writes_the_windows(
    windows: tuple[int, ...], flags: list[str], tmp_path: Path
) -> None:
    """The written flags; megatron-core, given the written file, windows the same blocks by
    the same number of keys (its (left, right) window: keys i - left to i)."""
    plan, costing = _plan(SPEC)
    plan = dataclasses.replace(
        plan, model=dataclasses.replace(plan.model, attention_windows=windows)
    )
    text = export_plan(plan, Target.MEGATRON, costing).text
    written = [line for line in text.splitlines() if line.startswith("--window")]
    assert written == flags
    assert [f"--{k} {v}" for k, v in window_args(plan.model)] == flags
    if importlib.util.find_spec("megatron") is not None:
        assert _megatron_windows(text, tmp_path) == list(windows)
    said = read(text, world_size=8, source="windows.args").model_says
    assert said is not None and said.windows is not None
    assert said.windows.value == (windows or (0,) * 6)


def test_megatron_export_refuses_two_window_sizes() -> None:
    plan, costing = _plan(SPEC)
    plan = dataclasses.replace(
        plan, model=dataclasses.replace(plan.model, attention_windows=(64, 128, 0, 64, 128, 0))
    )
    with pytest.raises(ValueError, match=r"sliding windows of 2 sizes \(\[64, 128\] keys\)"):
        export_plan(plan, Target.MEGATRON, costing)


def test_read_megatron_window_patterns() -> None:
    """Megatron-LM's pattern expressions (`moe_freq_type`: lists, + and * by a whole number)
    and a bad one, refused by name."""
    base = f"{JOB} --num-layers 6 --hidden-size 256 --num-attention-heads 4 --window-size 63,0 "
    for skip, want in (
        ("([1]*2+[0])*2", (64, 64, 0) * 2),
        ("[1,0]*3", (64, 0) * 3),
        ("2", (64, 0) * 3),
    ):
        said = read(base + f"--window-attn-skip-freq {skip}", world_size=8, source="a").model_says
        assert said is not None and said.windows is not None and said.windows.value == want
    no_limit = read(base.replace("63,0", "-1,0"), world_size=8, source="a").model_says
    assert no_limit is not None and no_limit.windows is not None
    assert no_limit.windows.value == (0,) * 6
    for bad, rule in (
        ("[1,2]*3", "not a list of 0 and 1"),
        ("[__import__('os')]", "not a list of 0 and 1"),
        ("[1]*4", "names 4 blocks, but --num-layers is 6"),
        ("0", "whole number n >= 1"),
    ):
        with pytest.raises(ValueError, match=re.escape(rule)):
            read(base + f"--window-attn-skip-freq {bad}", world_size=8, source="a")
    with pytest.raises(ValueError, match="must be two integers"):
        read(base.replace("63,0", "63"), world_size=8, source="a")


def test_a_configuration_with_other_windows_is_another_model() -> None:
    """The windows a Megatron file states against the model judged: the same windows agree
    (a window as long as the sequence is none), others, or none where the model has them,
    are refused naming both."""
    profile = parse_model(SPEC + ",full_attention_every=3").to_profile(seq_len=SEQ)
    base = (
        f"{JOB} --num-layers 6 --hidden-size 256 --num-attention-heads 4 "
        f"--ffn-hidden-size {profile.ffn} "
    )

    def says(flags: str) -> ModelSays:
        out = read(base + flags, world_size=8, source="m.args").model_says
        assert out is not None
        return out

    assert says("--window-size 63,0 --window-attn-skip-freq 3").mismatch(profile) is None
    problem = says("").mismatch(profile)
    assert problem is not None
    assert "no --window-size gives no sliding window" in problem
    assert "has sliding windows of 64 keys on 4 blocks" in problem
    other = says("--window-size 127,0 --window-attn-skip-freq 3").mismatch(profile)
    assert other is not None and "sliding windows of 128 keys on 4 blocks" in other
    plain = parse_model("llama:layers=6,hidden=256,heads=4,vocab=100").to_profile(seq_len=SEQ)
    assert says("").mismatch(plain) is None
    assert says(f"--window-size {SEQ - 1},0").mismatch(plain) is None  # holds every key
    assert says("--window-size 63,0").mismatch(plain) is not None


def test_torchtitan_export_names_the_windows() -> None:
    plan, costing = _plan(SPEC + ",full_attention_every=3")
    text = export_plan(plan, Target.TORCHTITAN, costing).text
    assert "# the plan prices sliding windows of 64 keys on 4 blocks of 6" in text
    plain, costing = _plan("llama:layers=6,hidden=256,heads=4,vocab=100")
    assert "sliding" not in export_plan(plain, Target.TORCHTITAN, costing).text


def test_the_plan_table_and_the_report_name_the_windows() -> None:
    """`paraplan plan`'s table and the report's context line say which blocks are banded and
    by how many keys (counted here from the spec: every third block full, the rest 64); a
    model without windows gets no such line."""
    from paraplan.planner.config import TrainConfig
    from paraplan.planner.explain import format_plan
    from paraplan.report.compose import context_of

    said = "sliding windows of 64 keys on 4 of 6 blocks, full causal on the rest"
    train = TrainConfig(global_batch=16, seq_len=SEQ)
    cluster = parse_cluster(CLUSTER)
    for spec, windowed in (
        (SPEC + ",full_attention_every=3", True),
        (SPEC[: SPEC.rindex(",")], False),
    ):
        plan, _ = _plan(spec)
        context = context_of(parse_model(spec).to_profile(seq_len=SEQ), cluster, train)
        if windowed:
            assert f"attention: {said} (priced over the band)" in format_plan(plan)
            assert context.endswith(f"; {said}")
        else:
            assert "attention:" not in format_plan(plan) and "sliding" not in context
