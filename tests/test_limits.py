"""Bounds on every number a user gives (issue 14): each hostile number of the issue, and one
per flag, is refused at once (exit 2, one line naming the value and the limit), where it used
to raise OverflowError or run for minutes; the limits clear the largest published runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import paraplan
from paraplan.planner import limits
from paraplan.planner.limits import Bound, show_number
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.profile_io import load_profile, profile_to_dict, save_profile

from .robust_helpers import PLAN, TINY, refused

_BASE = ["plan", "--model", TINY, "--no-progress"]
_CL = ["--cluster", "2xcpu"]
_GB = ["--global-batch", "4"]

CASES: list[tuple[str, list[str], list[str]]] = [
    # (id, argv, needles): every case of the issue, then one per bounded flag
    ("gb-inf", [*_BASE, *_CL, "--global-batch", "inf"], ["--global-batch", "'inf'"]),
    ("seq-inf", [*PLAN, "--seq-len", "inf"], ["--seq-len", "'inf'"]),
    ("gb-1e12", [*_BASE, *_CL, "--global-batch", "1e12"], ["'1e12'", "limit of 65,536"]),
    ("gb-1e30", [*_BASE, *_CL, "--global-batch", "1e30"], ["'1e30'", "limit of 65,536"]),
    ("gb-1e8", [*_BASE, *_CL, "--global-batch", "100000000"], ["limit of 65,536"]),
    ("cluster-1e12", [*_BASE, *_GB, "--cluster", "1000000000000xh100"], ["1,048,576 GPUs"]),
    (
        "layers-1e12",
        ["plan", "--model", "gpt:layers=1000000000000,hidden=64,heads=2,vocab=9", *_CL, *_GB],
        ["layers=1000000000000", "limit of 1,024 blocks"],
    ),
    (
        "hidden-1e12",
        ["plan", "--model", "gpt:layers=2,hidden=1000000000000,heads=2,vocab=9", *_CL, *_GB],
        ["hidden=1000000000000", "limit of 262,144"],
    ),
    (
        "experts-1e12",
        [
            "plan",
            "--model",
            "moe:layers=2,hidden=64,heads=2,vocab=9,experts=1000000000000,top_k=1",
            *_CL,
            *_GB,
        ],
        ["experts=1000000000000"],
    ),
    ("gpus-1e8", [*_BASE, *_GB, "--gpus", "100000000", "--gpu", "h100"], ["--gpus", "1,048,576"]),
    (
        "gpus-per-node",
        [*_BASE, *_GB, "--gpus", "8", "--gpu", "h100", "--gpus-per-node", "1e12"],
        ["--gpus-per-node", "limit of 1,024"],
    ),
    ("tokens", [*_BASE, *_CL, "--global-batch-tokens", "1e15"], ["limit of 68,719,476,736"]),
    (
        "tokens-over-seq",
        [*_BASE, *_CL, "--global-batch-tokens", "64M", "--seq-len", "64"],
        ["--global-batch-tokens 67108864 / seq_len 64", "limit of 65,536"],
    ),
    ("top", [*PLAN, "--top", "1000000000"], ["--top", "limit of 1,000"]),
    ("top-negative", [*PLAN, "--top", "-1"], ["--top", ">= 0"]),
    (
        "fix-pp",
        [*_BASE, *_GB, "--cluster", "512xcpu", "--fix", "pp=256"],
        ["--fix pp=256", "limit of 128 pipeline stages"],
    ),
    ("headroom-nan", [*PLAN, "--memory-headroom", "nan"], ["memory_headroom=nan"]),
    (
        "profile-tokens",
        ["profile", "--model", "gpt2", "--batch", "65536", "--seq-len", "1024"],
        ["--batch x --seq-len", "limit of 16,777,216"],
    ),
    (
        "checkpoint-micro-batch",
        ["checkpoint", "--model", TINY, "--budget", "1G", "--micro-batch", "10000000"],
        ["--micro-batch", "65,536"],
    ),
    (
        "checkpoint-time-limit",
        ["checkpoint", "--model", TINY, "--budget", "1G", "--time-limit", "inf"],
        ["--time-limit", "'inf'"],
    ),
    (
        "compare-budgets",
        ["compare", "--model", TINY, *_CL, *_GB, "-o", "r", "--tradeoff-budgets", "1000000000"],
        ["--tradeoff-budgets", "256"],
    ),
    (
        "compare-ilp-limit",
        ["compare", "--model", TINY, *_CL, *_GB, "-o", "r", "--ilp-time-limit", "1e300"],
        ["--ilp-time-limit", "a week"],
    ),
]


@pytest.mark.parametrize(("argv", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_numbers_are_refused_at_once(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    refused(capsys, argv, *needles, within_s=3.0)


def test_cluster_file_counts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`nodes: 1e12` (a float) and `nodes: 1000000000000` in a cluster file."""
    path = tmp_path / "c.yaml"
    path.write_text("accelerator: h100\nnodes: 1e12\ngpus_per_node: 8\n")
    refused(capsys, [*_BASE, *_GB, "--cluster", str(path)], "'nodes' must be a positive integer")
    path.write_text("accelerator: h100\nnodes: 1000000000000\ngpus_per_node: 8\n")
    refused(capsys, [*_BASE, *_GB, "--cluster", str(path)], "limit of 1,048,576 GPUs")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("experts", 10**12, "experts=1000000000000 is above the limit"),
        ("act_dtype_bytes", 0, "act_dtype_bytes=0 is below the minimum of 1"),
        ("heads", 0, "heads=0 is below the minimum of 1"),
        ("hidden", float("nan"), "profile.hidden: nan is not a finite number"),
        ("seq_len", 2**30, "seq_len=1073741824 is above the limit"),
        ("top_k", 9, "top_k=9 is above the limit of 8 experts"),
    ],
)
def test_profile_counts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, field: str, value: object, needle: str
) -> None:
    """A profile with `experts: 1e12` ran the search for minutes; zero act_dtype_bytes or heads
    divided by zero; NaN printed 'step time nan s'."""
    doc = profile_to_dict(PRESETS["mixtral-8x7b"].to_profile(256))
    doc["profile"][field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    argv = ["plan", "--profile", str(path), "--cluster", "8xh100", *_GB, "--no-progress"]
    refused(capsys, argv, str(path), needle)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda layer: layer.update(fwd_flops=-1.0), "layers.1.fwd_flops: -1.0 is less than"),
        (lambda layer: layer.update(params=-5), "layers.1.params: -5 is less than"),
        (lambda layer: layer.update(act_tp_bytes=1e300), "act_tp_bytes: 1e+300 is larger"),
    ],
)
def test_profile_layer_figures(tmp_path: Path, mutate, needle: str) -> None:
    doc = profile_to_dict(PRESETS["gpt2"].to_profile(128))
    mutate(doc["profile"]["layers"][1])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=needle.replace("+", r"\+").replace(".", r"\.")):
        load_profile(path)


def test_nothing_non_finite_is_written(tmp_path: Path) -> None:
    """`-o` wrote bare NaN (not JSON) for a profile that held one."""
    prof = PRESETS["gpt2"].to_profile(128)
    bad = dataclasses.replace(prof, hidden=float("nan"))
    with pytest.raises(ValueError, match=r"holds nan at profile\.hidden.*nothing was written"):
        save_profile(bad, tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == []


def test_api_checks_bounds_too() -> None:
    with pytest.raises(ValueError, match="global_batch=100000000 is above the limit"):
        paraplan.plan(TINY, "2xcpu", global_batch=10**8)
    with pytest.raises(ValueError, match="GPUs=8000000 is above the limit"):
        paraplan.plan(TINY, "8000000xh100", global_batch=8)


def test_presets_plan_within_the_limits() -> None:
    """The limits clear real runs: every preset at its context length; Llama 3 405B's batch
    (16M tokens of 8,192) on 16,384 GPUs (Dubey et al. 2024)."""
    cluster = (
        paraplan.planner_cluster("16384xh100") if hasattr(paraplan, "planner_cluster") else None
    )
    del cluster
    for spec in PRESETS.values():
        limits.check_profile(spec.to_profile(), where=spec.name)
    limits.GLOBAL_BATCH.check(2048, "batch")  # 16M tokens / 8192
    limits.GPUS.check(16384, "gpus")


def test_bound_messages() -> None:
    b = Bound(unit="things", minimum=1, maximum=10, reason="a reason")
    assert b.check(10, "x") == 10
    for value, needle in (
        (11, "x=11 is above the limit of 10 things (a reason); give at most 10"),
        (0, "x=0 is below the minimum of 1 things; give 1 to 10"),
        (True, "x=True must be a whole number of things from 1 to 10"),
        (2.0, "x=2.0 must be a whole number"),
    ):
        with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            b.check(value, "x")
    assert show_number(10**5000) == "~1e5000 (5001 digits)"  # str() of it raises in Python
    assert show_number(-(10**40)).startswith("-~1e40")
    assert show_number("y" * 100).endswith("...")
