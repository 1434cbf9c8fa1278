"""The search's static screen (issue 16, `search_blocks.states_overflow_all`): a schedule of a
block is skipped before anything is priced when every choice's stages hold, whatever their
activations, more than the memory. Checked against the evaluator itself: the model-wide floor
(`states_floor_bytes`) lies below every layout's largest static total, and nothing a screened
schedule holds fits, nor do its offload rescues, nor its per-layer recompute solutions (exact
memory of each, `Evaluator.memory`); and the search ranks the same strategies with the screen
as without it. Its optimum is checked against brute force in tests/test_search.py (a 13B
Llama on 8 L4s, whose pipelines of 2 stages overflow)."""

from __future__ import annotations

import random

import pytest

from paraplan.planner import search as search_module
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.options import option_problem
from paraplan.planner.model_parse import parse_model
from paraplan.planner.options import rescues
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.search_blocks import states_floor_bytes, states_overflow_all
from paraplan.planner.strategy import Recompute

SPACES = {
    # issue 16's 1T GPT: pipelines of 2 to 128 stages whose ZeRO-1 states overflow 80 GB
    "1t-gpt-3072xa100": (
        "gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048",
        "3072xa100-80gb",
        3072,
        2048,
    ),
    "llama-13b-4xl4": (
        "llama:layers=40,hidden=5120,heads=40,kv_heads=8,ffn=13824,vocab=32000,seq=2048",
        "4xl4",
        8,
        2048,
    ),
    "mixtral-64xh100": ("mixtral-8x7b", "64xh100", 64, 4096),
}


def _evaluator(name: str) -> Evaluator:
    model, cluster, batch, seq = SPACES[name]
    return Evaluator(
        parse_model(model).to_profile(seq_len=seq),
        parse_cluster(cluster),
        TrainConfig(global_batch=batch, seq_len=seq),
    )


def _pipelined(ev: Evaluator) -> list:
    """Every (block, schedule, virtual stages, probe) with pp > 1 whose probe is valid."""
    out = []
    for block in Search(ev).blocks():
        if block.base.pp == 1:
            continue
        for sched, v in block.schedules:
            probe = block.probe(sched, v)
            if ev.violation(probe) is None:
                out.append((block, sched, v, probe))
    return out


@pytest.mark.parametrize("name", list(SPACES))
def test_floor_is_below_every_layouts_largest_static_total(name: str) -> None:
    ev = _evaluator(name)
    sm = ev.stage_model
    rng = random.Random(16)
    items = _pipelined(ev)
    checked = 0
    for block, sched, v, probe in rng.sample(items, min(len(items), 120)):
        for sp, zero, off, rc in block.rest:
            floor = states_floor_bytes(ev, probe, zero, off)
            lay = sm.layout(probe.pp, v, rc, probe.tp, sp, sched)
            static = ev.static_totals(
                sm.stages(lay), probe.tp, probe.ep_dp, probe.dp * probe.cp, zero, off, 1
            )
            assert floor <= max(static) * (1 + 1e-12), (probe.short(), zero, off)
            checked += 1
    assert checked >= 200


@pytest.mark.parametrize("name", ["1t-gpt-3072xa100", "llama-13b-4xl4"])
def test_screened_schedules_fit_nothing(name: str) -> None:
    ev = _evaluator(name)
    cap = ev.capacity_bytes
    rng = random.Random(16)
    items = _pipelined(ev)
    screened = passed = 0
    for block, sched, v, probe in rng.sample(items, min(len(items), 150)):
        if not states_overflow_all(ev, probe, block.rest, {}):
            passed += 1
            continue
        screened += 1
        for sp, zero, off, rc in block.rest:
            s = block.strategy(sched, v, sp, zero, off, rc)
            variants = [x for tier in rescues(s, Pins()) for x in tier if option_problem(x) is None]
            if rc == Recompute.PER_LAYER:
                variants = []  # solved without offload (search.py)
            for member in (s, *variants):
                assert ev.memory(member)[0].total_bytes > cap, member.short()
    assert screened >= 10  # not vacuous, and not everything: the rest is searched as before
    assert passed >= 10


def test_floor_screens_what_the_layouts_screen_on_the_1t_gpt() -> None:
    """The model-wide floor alone decides most screened schedules of the 1T GPT (so the
    layouts' static totals are rarely built), and never screens one the layouts would not."""
    ev = _evaluator("1t-gpt-3072xa100")
    cap = ev.capacity_bytes
    items = _pipelined(ev)
    by_floor = by_layout = 0
    for block, _, _, probe in random.Random(16).sample(items, 200):
        overflow = states_overflow_all(ev, probe, block.rest, {})
        floor_only = all(
            states_floor_bytes(ev, probe, zero, off) + ev.pipeline_buffer_bytes(probe, sp) > cap
            for sp, zero, off, _ in block.rest
        )
        assert overflow or not floor_only, probe.short()
        by_floor += floor_only
        by_layout += overflow
    assert by_layout >= 20
    assert by_floor >= by_layout // 2


@pytest.mark.parametrize("name", ["1t-gpt-3072xa100", "llama-13b-4xl4", "mixtral-64xh100"])
def test_the_screen_changes_no_ranking(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The K best with the screen equal those without it (the search as brute force checks it,
    tests/test_search.py), strategy, step time and memory, offload rescues included."""
    screened = Search(_evaluator(name), runnable_only=True).run(top_k=3).ranked
    monkeypatch.setattr(search_module, "states_overflow_all", lambda *args: False)
    plain = Search(_evaluator(name), runnable_only=True).run(top_k=3).ranked
    assert [(e.strategy, e.step_time_s, e.memory.total_bytes) for e in screened] == [
        (e.strategy, e.step_time_s, e.memory.total_bytes) for e in plain
    ]
