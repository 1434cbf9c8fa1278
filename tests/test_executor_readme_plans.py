"""Every plan the README shows runs under the executor at a tiny scale of the same shape, or the
planner refuses it up front (issue 13's acceptance point).

`README_PLANS` lists, next to each README command, the plan the planner returned for it (the
planner's search takes 6-40 s per command, too slow to repeat here; re-derive the list with the
commands when the planner or the cost model changes). Each shape must pass the executor's
capability table at full size, and each README command must still be in the README. The tiny
scale keeps the shape: every degree above 1 becomes 2 and the choices stay (ZeRO stage, sequence
parallel, schedule, interleaving, the blocks' recompute policies, the model family); a shape
with three axes above 1 runs as its three two-axis projections (the tests run at most 4 ranks).
Each tiny plan is checked against the single-process reference as in test_executor_numerics.py
(loss, every gradient and the loss after one step, rel 1e-5), in one 4-rank launch.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from paraplan.planner.capabilities import Job, executor_gaps
from paraplan.planner.config import Optimizer, Precision
from paraplan.planner.strategy import Recompute, Schedule, Strategy
from tests.executor_plans import LAYERS, ROOT, make_plan

README_PLANS: dict[str, dict[str, object]] = {
    # `make plan`
    "paraplan plan --model llama3-8b --cluster 8xh100 --global-batch 256 --seq-len 8192": dict(
        family="llama", dp=4, cp=2, zero=1, schedule="none", recompute=("full", "none")
    ),
    "paraplan plan --model gpt3-175b --cluster 1024xa100-80gb --global-batch 1536 --seq-len 2048": (
        dict(
            family="gpt2",
            dp=32,
            tp=4,
            pp=8,
            zero=1,
            sp=True,
            schedule="interleaved_1f1b",
            vpp=8,
            recompute=("none", "selective"),
        )
    ),
    "paraplan plan --model llama3-405b --cluster 16384xh100 --global-batch-tokens 16M": dict(
        family="llama",
        dp=128,
        tp=8,
        pp=16,
        zero=1,
        sp=True,
        schedule="interleaved_1f1b",
        vpp=7,
        recompute=("full", "none"),
    ),
    "paraplan plan --profile gpt2.json --cluster 8xh100 --global-batch 64": dict(
        family="gpt2", dp=8, zero=1, schedule="none", recompute=("none",)
    ),
    'paraplan.plan("llama3-70b", "64xh100", global_batch=512, seq_len=8192)': dict(
        family="llama",
        dp=2,
        tp=4,
        pp=8,
        zero=1,
        sp=True,
        schedule="1f1b",
        recompute=("full", "none"),
    ),
    "--fix tp=8,pp=8,dp=24,zero=1,mbs=2,schedule=1f1b,recompute=full": dict(
        family="gpt2", dp=24, tp=8, pp=8, zero=1, schedule="1f1b", recompute=("full",)
    ),
    "paraplan plan --model examples/configs/gpt2-tiny.json --cluster 2xcpu --global-batch 8": (
        dict(family="gpt2", dp=2, zero=1, schedule="none", recompute=("none",))
    ),
    "`--fix cp=2`": dict(family="llama", cp=2, zero=1, schedule="none", recompute=("none",)),
    "`--fix ep=2`": dict(
        family="mixtral", dp=2, ep=2, zero=2, schedule="none", recompute=("none",)
    ),
}
"""README command (a fragment of its line) -> the plan's shape: degrees, ZeRO stage, sequence
parallel, schedule, virtual stages and the recompute policies its blocks use."""

AXES = ("dp", "tp", "pp", "cp")


def _strategy(shape: dict[str, object]) -> Strategy:
    policies = set(shape["recompute"])  # type: ignore[arg-type]
    recompute = Recompute(policies.pop()) if len(policies) == 1 else Recompute.PER_LAYER
    return Strategy(
        dp=int(shape.get("dp", 1)),  # type: ignore[call-overload]
        tp=int(shape.get("tp", 1)),  # type: ignore[call-overload]
        pp=int(shape.get("pp", 1)),  # type: ignore[call-overload]
        cp=int(shape.get("cp", 1)),  # type: ignore[call-overload]
        ep=int(shape.get("ep", 1)),  # type: ignore[call-overload]
        zero_stage=int(shape["zero"]),  # type: ignore[call-overload]
        sequence_parallel=bool(shape.get("sp", False)),
        schedule=Schedule(shape["schedule"]),
        virtual_stages=int(shape.get("vpp", 1)),  # type: ignore[call-overload]
        recompute=recompute,
    )


def tiny_plans(name: str, shape: dict[str, object]) -> dict[str, dict[str, object]]:
    """The tiny plans (make_plan keyword arguments) of a README shape, by test name."""
    big = [a for a in AXES if int(shape.get(a, 1)) > 1]  # type: ignore[call-overload]
    groups = [tuple(big)] if len(big) <= 2 else list(itertools.combinations(big, 2))
    policies = tuple(shape["recompute"])  # type: ignore[arg-type]
    out: dict[str, dict[str, object]] = {}
    for axes in groups:
        # one axis: degree 4 (every test runs on 4 ranks); two: 2 x 2
        kw: dict[str, object] = {a: 2 if len(axes) == 2 else 4 for a in axes}
        # ZeRO shards over dp x cp
        kw.update(family=shape["family"], zero=shape["zero"] if {"dp", "cp"} & set(axes) else 0)
        kw["recompute"] = tuple(policies[i % len(policies)] for i in range(LAYERS))
        if int(shape.get("ep", 1)) > 1:  # type: ignore[call-overload]
            kw["ep"] = 2
        if "tp" in axes:
            kw["sp"] = shape.get("sp", False)
        if "pp" in axes:
            kw.update(schedule=shape["schedule"], nmb=2, mbs=1)
            if int(shape.get("vpp", 1)) > 1:  # type: ignore[call-overload]
                kw["vpp"] = 2
        out[f"{name}_{'_'.join(axes)}"] = kw
    return out


def _all_tiny() -> dict[str, dict[str, object]]:
    """Every README shape's tiny plans, each distinct plan once."""
    out: dict[str, dict[str, object]] = {}
    seen: set[str] = set()
    for i, shape in enumerate(README_PLANS.values()):
        for name, kw in tiny_plans(f"readme{i}", shape).items():
            key = repr(sorted(kw.items()))
            if key not in seen:
                seen.add(key)
                out[name] = kw
    return out


def test_readme_commands_are_listed() -> None:
    """Each listed command is still in the README (the list follows the text)."""
    text = (ROOT / "README.md").read_text()
    for command in README_PLANS:
        assert command.strip("`") in text, command


@pytest.mark.parametrize("command", list(README_PLANS))
def test_readme_plans_pass_the_capability_table(command: str) -> None:
    """The full-size plan is one the executor runs (the planner returns runnable plans)."""
    shape = README_PLANS[command]
    job = Job(
        strategy=_strategy(shape),
        experts=8 if shape["family"] == "mixtral" else 0,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
    )
    assert executor_gaps(job) == ()


def test_tiny_plans_keep_the_shape() -> None:
    """4 ranks, and every tiny plan passes the capability table too."""
    from paraplan.planner.capabilities import plan_gaps

    for name, kw in _all_tiny().items():
        plan = make_plan(**kw)  # type: ignore[arg-type]
        assert plan.cluster.num_gpus == 4, name
        assert plan_gaps(plan) == (), name


@pytest.mark.multiprocess
def test_readme_plans_run_at_tiny_scale(tmp_path: Path) -> None:
    """Every tiny plan on 4 ranks against the single-process reference."""
    pytest.importorskip("transformers")
    from tests.test_executor_numerics import _check, _run

    plans = _all_tiny()
    _check(_run(tmp_path, 4, plans), plans)
