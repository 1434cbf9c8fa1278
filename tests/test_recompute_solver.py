"""Per-layer recompute in the planner: the stage solver against brute force, and the planner
using it where it wins (recorded in the plan JSON, shown by `paraplan plan`)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest

from paraplan.planner.api import make_plan
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.recompute import LayerChoice, StageProblem, solve_stage
from paraplan.planner.explain import format_plan
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.plan_io import plan_from_dict
from paraplan.planner.search import Search
from paraplan.planner.strategy import Recompute, Schedule

POLICIES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


def _brute(problem: StageProblem) -> float | None:
    """Least recompute seconds over every assignment that fits (None: nothing fits)."""
    best = None
    options = [POLICIES if c is not None else (Recompute.NONE,) for c in problem.choices]
    for picks in itertools.product(*options):
        if problem.bytes_of(picks) <= problem.budget_bytes:
            t = problem.seconds_of(picks)
            best = t if best is None else min(best, t)
    return best


def _choice(rng: random.Random) -> LayerChoice:
    """Integer byte sizes (the DP's units are then exact bytes), random times."""
    full = rng.randint(1, 20)
    sel = full + rng.randint(0, 60)
    none = sel + rng.randint(0, 60)
    fwd = rng.uniform(0.5, 2.0)
    return LayerChoice(
        none_bytes=none,
        selective_bytes=sel,
        full_bytes=full,
        selective_s=fwd * rng.uniform(0.05, 0.4),
        full_s=fwd,
        back_bytes=none - full + rng.randint(0, 40),
    )


def _problem(rng: random.Random, choices: list[LayerChoice | None]) -> StageProblem:
    total = sum(c.none_bytes for c in choices if c is not None)
    return StageProblem(
        choices=tuple(choices),
        fixed_bytes=rng.randint(0, 30),
        inflight=rng.choice([1, 2, 3]),
        transient_bytes=rng.randint(0, 50),
        head_bytes=rng.choice([0, rng.randint(1, 40)]),
        budget_bytes=rng.uniform(0.2, 1.1) * 3 * total,
    )


@pytest.mark.parametrize("seed", range(40))
def test_heterogeneous_stage_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    layers = rng.randint(1, 6)
    choices: list[LayerChoice | None] = [_choice(rng) for _ in range(layers)]
    if rng.random() < 0.5:
        choices.insert(0, None)  # an embedding that never recomputes
    problem = _problem(rng, choices)
    picks = solve_stage(problem)
    best = _brute(problem)
    if best is None:
        assert picks is None
        return
    assert picks is not None
    assert problem.bytes_of(picks) <= problem.budget_bytes * (1 + 1e-12)
    assert problem.seconds_of(picks) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_identical_blocks_equal_brute_force(seed: int) -> None:
    """The closed form over counts (every transformer stage), any byte sizes."""
    rng = random.Random(1000 + seed)
    block = _choice(rng)
    block = replace(
        block,
        none_bytes=block.none_bytes * 1.37e6,
        selective_bytes=block.selective_bytes * 1.37e6,
        full_bytes=block.full_bytes * 1.37e6,
        back_bytes=block.back_bytes * 1.37e6,
    )
    choices: list[LayerChoice | None] = [None, *([block] * rng.randint(1, 7)), None]
    problem = _problem(rng, choices)
    problem = replace(
        problem,
        fixed_bytes=problem.fixed_bytes * 1.37e6,
        transient_bytes=problem.transient_bytes * 1.37e6,
        head_bytes=problem.head_bytes * 1.37e6,
    )
    picks = solve_stage(problem)
    best = _brute(problem)
    if best is None:
        assert picks is None
        return
    assert picks is not None
    assert problem.bytes_of(picks) <= problem.budget_bytes * (1 + 1e-12)
    assert problem.seconds_of(picks) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_everything_fits_means_no_recompute() -> None:
    block = LayerChoice(
        none_bytes=10, selective_bytes=5, full_bytes=1, selective_s=0.1, full_s=1.0, back_bytes=9
    )
    problem = StageProblem(
        choices=(block,) * 4,
        fixed_bytes=0,
        inflight=1,
        transient_bytes=0,
        head_bytes=0,
        budget_bytes=40,
    )
    assert solve_stage(problem) == (Recompute.NONE,) * 4
    tighter = replace(problem, budget_bytes=39)
    assert solve_stage(tighter) == (Recompute.SELECTIVE,) + (Recompute.NONE,) * 3


def _ev(model: str, cluster: str, batch: int, seq: int) -> Evaluator:
    return Evaluator(
        parse_model(model).to_profile(seq_len=seq),
        parse_cluster(cluster),
        TrainConfig(global_batch=batch, seq_len=seq),
    )


def test_per_layer_is_never_slower_than_a_uniform_policy_that_fits() -> None:
    """Without TP/EP (whose collectives full recompute redoes), and outside the single-pass
    case (where the solver's stage bound is conservative), `per_layer` takes at most the time
    of the fastest uniform policy that fits, and it fits whenever one does."""
    ev = _ev("gpt:layers=12,hidden=2048,heads=16,vocab=32000,seq=4096", "4xl4", 16, 4096)
    checked = wins = 0
    for s in Search(ev, Pins(tp=1)).valid():
        if s.recompute != Recompute.PER_LAYER or ev.single_pass(s):
            continue
        uniform = [ev.evaluate(replace(s, recompute=r)) for r in POLICIES]
        fitting = [e for e in uniform if e.feasible]
        if not fitting:
            continue
        mine = ev.evaluate(s)
        checked += 1
        assert mine.feasible, s.short()
        fastest = min(e.step_time_s for e in fitting)
        assert mine.step_time_s <= fastest * (1 + 1e-12), s.short()
        wins += mine.step_time_s < fastest * (1 - 1e-6)
    assert checked > 20
    assert wins > 0  # the per-layer choice is strictly better somewhere in this space


def test_plan_records_per_layer_decisions(tmp_path) -> None:
    """A memory-bound plan picks per-layer recompute; the JSON holds each layer's decision,
    bytes kept and seconds added, and the table says what it costs and saves.

    The schedule is pinned to 1F1B: with ZB-V's smaller in-flight memory uniform selective
    recompute fits and wins, which is not what this test is about."""
    profile = parse_model("gpt3-175b").to_profile(seq_len=2048)
    cluster = parse_cluster("64xa100-80gb")
    train = TrainConfig(global_batch=128, seq_len=2048)
    plan = make_plan(profile, cluster, train, pins=Pins(schedule=Schedule.ONE_F_ONE_B)).plan
    assert plan.recompute_policy == "per_layer"
    blocks = [d for d in plan.layers if d.name.startswith("block")]
    kinds = {d.recompute for d in blocks}
    assert len(kinds) > 1  # a mix no uniform policy gives
    assert all(d.recompute == "none" for d in plan.layers if not d.name.startswith("block"))
    for d in blocks:
        assert (d.recompute_s > 0) == (d.recompute != "none")
    full_kept = {d.kept_bytes for d in blocks if d.recompute == "full"}
    none_kept = {d.kept_bytes for d in blocks if d.recompute == "none"}
    if full_kept and none_kept:
        assert max(full_kept) < min(none_kept)
    ev = Evaluator(profile, cluster, train)
    pinned = {
        **{
            k: getattr(plan.parallelism, k)
            for k in ("dp", "tp", "pp", "cp", "zero_stage", "sequence_parallel", "virtual_stages")
        },
        "micro_batch_size": plan.micro_batch_size,
        "schedule": Schedule.ONE_F_ONE_B,
    }
    for rc in POLICIES:  # every uniform policy with the same degrees is slower or does not fit
        result = Search(ev, Pins(**pinned, recompute=rc)).run(top_k=0)
        if result.best is not None:
            assert result.best.step_time_s > plan.predicted.step_time_s
    assert plan.predicted.recompute_saved_bytes > 0
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    assert plan_from_dict(json.loads(path.read_text())) == plan
    table = format_plan(plan)
    assert "per-layer solver" in table and "saves" in table and "per step" in table
