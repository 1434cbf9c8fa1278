"""The search's bound on per-layer recompute (issue 16): the linear relaxation of a stage's
knapsack never exceeds what the solver picks, and the per-layer strategy bound built on it
never exceeds the strategy's step time in any mesh order (fast, CPU only)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.options import has_options
from paraplan.planner.cost.recompute import (
    LayerChoice,
    least_recompute_s,
    relaxation_fits,
    solve_stage,
)
from paraplan.planner.model_parse import parse_model
from paraplan.planner.search import Search
from paraplan.planner.search_bounds import (
    per_layer_lower_bound_s,
    placement_bound,
    strategy_lower_bound_s,
)
from paraplan.planner.search_space import mesh_orders
from paraplan.planner.strategy import Recompute
from tests.test_recompute_solver import _choice, _problem


@pytest.mark.parametrize("seed", range(60))
def test_relaxation_is_below_the_solution(seed: int) -> None:
    rng = random.Random(seed)
    if seed % 2:  # identical blocks (the closed form), at large byte sizes
        block = _choice(rng)
        scale = 1.37e6
        block = LayerChoice(
            none_bytes=block.none_bytes * scale,
            selective_bytes=block.selective_bytes * scale,
            full_bytes=block.full_bytes * scale,
            selective_s=block.selective_s,
            full_s=block.full_s,
            back_bytes=block.back_bytes * scale,
        )
        choices: list[LayerChoice | None] = [None, *([block] * rng.randint(1, 40)), None]
        problem = _problem(rng, choices)
        problem = replace(
            problem,
            fixed_bytes=problem.fixed_bytes * scale,
            transient_bytes=problem.transient_bytes * scale,
            head_bytes=problem.head_bytes * scale,
        )
    else:  # unlike blocks (enumerated or the dynamic program)
        choices = [_choice(rng) for _ in range(rng.randint(1, 7))]
        problem = _problem(rng, choices)
    picks = solve_stage(problem)
    bound = least_recompute_s(problem)
    assert bound >= 0.0
    if picks is not None:
        assert bound <= problem.seconds_of(picks)
        assert relaxation_fits(problem)  # what the search drops per-layer solves by
    for scale in (0.3, 0.6, 0.9):  # tighter budgets: some no assignment fits
        tight = replace(problem, budget_bytes=problem.budget_bytes * scale)
        if not relaxation_fits(tight):
            assert solve_stage(tight) is None


SPACES = {
    "gpt3-175b-1024xa100": ("gpt3-175b", "1024xa100-80gb", 1536, 2048),
    "llama-4xl4": (
        "llama:layers=16,hidden=4096,heads=32,kv_heads=8,ffn=11008,vocab=32000,seq=4096",
        "4xl4",
        8,
        4096,
    ),
    "llama3-8b-64xh100-long": ("llama3-8b", "64xh100", 64, 16384),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_per_layer_bound_is_below_every_mesh_order(name: str) -> None:
    model, cluster, batch, seq = SPACES[name]
    ev = Evaluator(
        parse_model(model).to_profile(seq_len=seq),
        parse_cluster(cluster),
        TrainConfig(global_batch=batch, seq_len=seq),
    )
    blocks = list(Search(ev).blocks())
    rng = random.Random(16)
    checked = tight = 0
    for _ in range(3000):
        if checked == 60:
            break
        block = rng.choice(blocks)
        sched, v = rng.choice(block.schedules)
        sp, zero, off, _ = rng.choice(block.rest)
        s = block.strategy(sched, v, sp, zero, off, Recompute.PER_LAYER)
        if ev.violation(s) is not None or has_options(s):
            continue
        coll = placement_bound(ev, s)
        bound = per_layer_lower_bound_s(ev, s, coll)
        times = [ev.time(replace(s, mesh_order=o)).step_time_s for o in mesh_orders(s)]
        assert bound <= min(times), s.short()
        plain = strategy_lower_bound_s(ev, replace(s, recompute=Recompute.NONE), coll)
        assert plain * (1 - 1e-9) <= bound
        tight += bound > plain * (1 + 1e-6)  # the recompute it must add
        checked += 1
    assert checked >= 20
    assert tight >= checked // 4  # not vacuous: about half must recompute (39, 28, 30 of 60)
