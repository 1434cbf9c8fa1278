"""Asynchronous pipelines (PipeDream-2BW, Narayanan et al. 2021, arXiv 2006.09503): priced
with no flush bubble and the stashed weight version, offered only with `--allow-async`,
found by the search exactly (against brute force over the same space), stated in `explain`,
and refused by the executor's capability table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.api import plan
from paraplan.cli import main
from paraplan.planner.capabilities import plan_gaps
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.explain import explain
from paraplan.planner.model_parse import parse_model
from paraplan.planner.options import Consent, fit_variants
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search, rank_key
from paraplan.planner.strategy import Schedule, Strategy

CASE = dict(global_batch=32, seq_len=1024, model_source="spec")
"""GPT-2 small on 16 L4s: a pipeline pays a visible flush bubble there."""


def _ev() -> Evaluator:
    profile = parse_model("gpt2").to_profile(1024, act_bytes=2)
    return Evaluator(profile, parse_cluster("16xl4"), TrainConfig(global_batch=32, seq_len=1024))


def test_no_bubble_and_one_stashed_weight_version() -> None:
    ev = _ev()
    sync = Strategy(dp=4, tp=1, pp=4, schedule=Schedule.ONE_F_ONE_B, micro_batch_size=1)
    asy = replace(sync, async_pipeline=True)
    t_sync, t_async = ev.time(sync), ev.time(asy)
    assert t_async.bubble_s == 0.0 and ev.evaluate(asy).bubble_fraction == 0.0
    # the flushed 1F1B pays (pp - 1) slots of fill and drain (Narayanan et al. 2021 §2.2)
    slot = t_sync.bubble_s / 3
    assert t_async.step_time_s == pytest.approx(t_sync.step_time_s - 3 * slot)
    # 2BW (§3.2): two weight versions, activations as 1F1B: memory + one copy of the weights
    (mem_s, stage_s), (mem_a, stage_a) = ev.memory(sync), ev.memory(asy)
    assert stage_s == stage_a
    assert mem_a.total_bytes - mem_s.total_bytes == pytest.approx(mem_s.params_bytes)
    assert mem_a.activations_bytes == mem_s.activations_bytes


def test_offered_only_when_allowed_and_refused_by_the_executor() -> None:
    plain = plan("gpt2", "16xl4", any_engine=True, **CASE).plan
    assert not plain.parallelism.async_pipeline
    assert not any(r.parallelism.async_pipeline for r in plain.runners_up)
    chosen = plan("gpt2", "16xl4", any_engine=True, allow_async=True, **CASE).plan
    assert chosen.parallelism.async_pipeline and chosen.schedule == Schedule.ONE_F_ONE_B
    assert chosen.predicted.step_time_s < plain.predicted.step_time_s
    assert chosen.predicted.hidden_costs.staleness_steps == 1
    assert chosen.predicted.hidden_costs.stashed_weight_bytes > 0
    text = explain(chosen)
    assert "staleness 1" in text and "--allow-async" in text and "does not run it" in text
    (gap,) = plan_gaps(chosen)
    assert "PipeDream-2BW" in gap and "cannot run it" in gap
    runnable = plan("gpt2", "16xl4", allow_async=True, **CASE).plan  # executor plans only
    assert not runnable.parallelism.async_pipeline
    with pytest.raises(ValueError, match="executor cannot run"):
        plan("gpt2", "16xl4", fix="async=true,pp=2", **CASE)
    with pytest.raises(ValueError, match="PipeDream-2BW is 1F1B"):
        plan("gpt2", "16xl4", fix="async=true,pp=1", any_engine=True, **CASE)


def test_search_with_async_equals_brute_force() -> None:
    ev, pins, consent = (
        _ev(),
        Pins(tp=1, cp=1, sequence_parallel=False),
        Consent(async_pipeline=True),
    )
    best = Search(ev, pins, consent=consent).run(top_k=0).best
    assert best is not None
    every = [
        ev.evaluate(v)
        for s in Search(ev, pins).valid()
        for v in (s, *fit_variants(s, pins, consent))
    ]
    brute = min((e for e in every if e.feasible), key=rank_key)
    assert brute.strategy.async_pipeline  # the case exercises the option
    assert best.step_time_s == pytest.approx(brute.step_time_s, rel=1e-12)
    assert best.strategy == brute.strategy


def test_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "gpt2", "--model-source", "spec", "--cluster", "16xl4"]
    args += ["--global-batch", "32", "--seq-len", "1024", "--no-progress", "--any-engine"]
    assert main([*args, "--allow-async"]) == 0
    out = capsys.readouterr().out
    assert "asynchronous pipeline (PipeDream-2BW)" in out
    assert "cannot run this plan" in out
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    helptext = capsys.readouterr().out
    assert "--allow-async" in helptext and "--allow-compression" in helptext
