"""The executor's capability table (planner/capabilities.py) against what the executor runs,
the search restricted to it (against brute force), and `paraplan run` refusing a plan before
any rank starts."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from itertools import product
from pathlib import Path

import pytest

from paraplan.cli import main as paraplan_main
from paraplan.planner.capabilities import Job, executor_gaps, plan_gaps, runnable_shape
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Optimizer, Precision, TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.plan_io import save_plan
from paraplan.planner.search import Search
from paraplan.planner.search_brute import brute_force
from paraplan.planner.strategy import Strategy
from tests.executor_plans import ROOT, make_plan
from tests.test_executor_numerics import PLANS_2, PLANS_4

CONFIGS = ROOT / "examples" / "configs"


def _job(experts: int = 0, **kw: object) -> Job:
    return Job(
        strategy=Strategy(**kw),  # type: ignore[arg-type]
        experts=experts,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
    )


def test_every_plan_the_numerics_tests_run_is_runnable() -> None:
    """The table must not refuse what the multi-process tests show the executor runs."""
    for name, kw in {**PLANS_2, **PLANS_4}.items():
        assert plan_gaps(make_plan(**kw)) == (), name


@pytest.mark.parametrize(
    ("job", "words"),
    [
        (_job(experts=8, dp=2, tp=1, pp=1, ep=2, zero_stage=1), "zero_stage=1 with ep=2"),
        (_job(dp=1, tp=1, pp=2, cp=2), "cp=2 with pp=2"),
        (_job(experts=8, dp=2, tp=2, pp=1), "mixture-of-experts"),
        (_job(dp=2, tp=1, pp=1, zero_stage=1, offload_optimizer=True), "offload_optimizer"),
    ],
)
def test_unrunnable_strategies_are_named(job: Job, words: str) -> None:
    gaps = executor_gaps(job)
    assert gaps and words in gaps[0] and "--fix" in gaps[0]


@pytest.mark.parametrize("model", ["llama", "moe"])
def test_runnable_search_equals_brute_force_over_runnable(model: str) -> None:
    """The default search returns the best runnable strategy: the best of brute force over
    the whole priced space, once the unrunnable ones are dropped; --any-engine is that space."""
    spec = {
        "llama": "llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=4096",
        "moe": "moe:layers=4,hidden=512,heads=8,kv_heads=2,ffn=1024,ffn_kind=swiglu,"
        "vocab=32000,seq=2048,experts=8,top_k=2",
    }[model]
    seq = 2048
    profile = parse_model(spec).to_profile(seq, act_bytes=2)
    ev = Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=16, seq_len=seq))
    pins = Pins(micro_batch_size=1)
    everything = brute_force(ev, pins)
    runnable = [e for e in everything if not plan_gaps_of(e.strategy, profile.experts)]
    assert len(runnable) < len(everything)  # the filter has something to remove
    best = Search(ev, pins, runnable_only=True).run(top_k=0).best
    assert best is not None and best.strategy == runnable[0].strategy
    unrestricted = Search(ev, pins).run(top_k=0).best
    assert unrestricted is not None and unrestricted.strategy == everything[0].strategy


def plan_gaps_of(s: Strategy, experts: int) -> tuple[str, ...]:
    return executor_gaps(
        Job(strategy=s, experts=experts, precision=Precision.BF16, optimizer=Optimizer.ADAMW)
    )


def _run(tmp_path: Path, plan_kw: dict, model: str, **changes: object) -> tuple[int, float]:
    """`paraplan run` on a hand-made plan with a script that leaves a marker if it starts
    (`changes` to its cluster; `attention_windows` to its model)."""
    plan = make_plan(**plan_kw)
    windows = changes.pop("attention_windows", None)
    if windows is not None:
        plan = replace(plan, model=replace(plan.model, attention_windows=windows))
    if changes:
        plan = replace(plan, cluster=replace(plan.cluster, **changes))
    path = tmp_path / "p.json"
    save_plan(plan, path)
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    start = time.monotonic()
    code = paraplan_main(["run", str(path), "--", str(script), "--model", str(CONFIGS / model)])
    elapsed = time.monotonic() - start
    assert not marker.exists()  # no rank started
    return code, elapsed


@pytest.mark.parametrize(
    ("plan_kw", "model", "changes", "words"),
    [
        (
            dict(family="llama", cp=2, pp=2, schedule="1f1b", nmb=2, mbs=1),
            "llama-tiny.json",
            {},
            "cp=2",
        ),
        (dict(family="llama", tp=2), "gpt2-tiny.json", {}, "fingerprint"),
        (dict(family="llama", dp=2), "llama-tiny.json", {"accelerator": "h100"}, "GPUs"),
        (
            dict(family="llama", dp=2),
            "llama-tiny.json",
            {"attention_windows": (16, 0, 16, 0)},
            "sliding windows (2 of 4 blocks see 16 keys",
        ),
    ],
    ids=["capability", "model", "device", "windows"],
)
def test_run_refuses_before_any_rank_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    plan_kw: dict,
    model: str,
    changes: dict,
    words: str,
) -> None:
    code, elapsed = _run(tmp_path, plan_kw, model, **changes)
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert err.count("\n") <= 2  # one message
    assert elapsed < 3.0


def test_strategies_alike_in_runnable_shape_are_runnable_alike() -> None:
    """`runnable_shape` names all the capability checks read beside the five fields the search
    varies within a block: over strategies (offload variants and options included) of a
    dense and an MoE space (1,500 sampled from each), strategies with equal keys have equal
    answers."""
    seen: dict[tuple, bool] = {}
    checked = 0
    for spec, cluster, experts in (
        (
            "llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=4096",
            "64xh100",
            0,
        ),
        ("moe:layers=4,hidden=512,heads=8,vocab=32000,seq=2048,experts=8,top_k=2", "8xh100", 8),
    ):
        seq = 2048
        ev = Evaluator(
            parse_model(spec).to_profile(seq, act_bytes=2),
            parse_cluster(cluster),
            TrainConfig(global_batch=64, seq_len=seq),
        )
        configs = list(Search(ev).configs())
        for s in random.Random(16).sample(configs, min(len(configs), 1500)):
            for params, powersgd, shard in product((False, True), (None, 4), (None, 2)):
                v = replace(s, offload_params=params, powersgd_rank=powersgd, dp_shard=shard)
                if shard is not None and (s.dp % shard or v.zero_stage != 3):
                    continue
                key = (
                    experts,
                    runnable_shape(v),
                    v.zero_stage,
                    v.offload_optimizer,
                    v.offload_params,
                    v.schedule,
                    v.virtual_stages,
                )
                runs = not executor_gaps(
                    Job(
                        strategy=v,
                        experts=experts,
                        precision=Precision.BF16,
                        optimizer=Optimizer.ADAMW,
                    )
                )
                assert seen.setdefault(key, runs) == runs, v.short()
                checked += 1
    assert checked > 2000
    assert len(set(seen.values())) == 2  # both answers occur
