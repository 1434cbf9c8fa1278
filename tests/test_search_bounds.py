"""The search's family bound (planner/search_bounds.py) is a valid lower bound, and the lean
makespan replay equals the full replay bit for bit (fast, CPU only)."""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import replace

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.comm import AxisLink
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.options import option_problem
from paraplan.planner.model_parse import parse_model
from paraplan.planner.options import rescues
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.search_bounds import (
    family_floor_s,
    family_key,
    family_lower_bound_s,
    placement_bound,
    strategy_lower_bound_s,
)
from paraplan.planner.search_space import mesh_orders
from paraplan.planner.solvers.pipeline_replay import makespan_s, simulate_pipeline
from paraplan.planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy

# Small and large spaces, dense and MoE, one node and many, long sequences (CP).
SPACES = {
    "gpt2-8xh100": ("gpt2", "8xh100", 16, 1024, None),
    "small-gpt-nodes-of-2": (
        "gpt:layers=8,hidden=512,heads=8,vocab=1000,seq=512",
        "16xa100-80gb",
        8,
        512,
        2,
    ),
    "tiny-moe-8xh100": (
        "moe:layers=4,hidden=256,heads=4,vocab=500,seq=256,experts=4,top_k=2",
        "8xh100",
        8,
        256,
        None,
    ),
    "llama-4xl4": (
        "llama:layers=16,hidden=4096,heads=32,kv_heads=8,ffn=11008,vocab=32000,seq=4096",
        "4xl4",
        8,
        4096,
        None,
    ),
    "gpt3-175b-1024xa100": ("gpt3-175b", "1024xa100-80gb", 1536, 2048, None),
    "llama3-8b-64xh100-long": ("llama3-8b", "64xh100", 64, 16384, None),
}
SAMPLES = 150
ORDERS = list(itertools.permutations(DEFAULT_MESH_ORDER))


def _space_evaluator(name: str) -> Evaluator:
    """The evaluator of one of `SPACES`."""
    model, cluster, batch, seq, gpn = SPACES[name]
    return Evaluator(
        parse_model(model).to_profile(seq_len=seq),
        parse_cluster(cluster, gpus_per_node=gpn),
        TrainConfig(global_batch=batch, seq_len=seq),
    )


@pytest.mark.parametrize("name", list(SPACES))
def test_family_bound_is_below_every_member(name):
    ev = _space_evaluator(name)
    blocks = list(Search(ev).blocks())
    rng = random.Random(16)
    checked = 0
    for _ in range(20 * SAMPLES):
        if checked == SAMPLES:
            break
        block = rng.choice(blocks)
        s = block.strategy(*rng.choice(block.schedules), *rng.choice(block.rest))
        if ev.violation(s) is not None:
            continue
        key = family_key(s)
        loose = family_lower_bound_s(ev, key, ev.lower_bound_coll)
        bound = family_lower_bound_s(ev, key, placement_bound(ev, key))  # the search's
        assert loose <= bound * (1 + 1e-9), s.short()  # placement is the tighter
        floor = family_floor_s(ev, key, placement_bound(ev, key))  # what `fast_choices` reads
        assert floor <= bound, s.short()
        # the member's own bound and true step time in every mesh order, offloaded variants too
        variants = [v for tier in rescues(s, Pins()) for v in tier if option_problem(v) is None]
        offloaded = family_lower_bound_s(
            ev, key, placement_bound(ev, key), offload_activations=True
        )  # for the members offloading activations, under a uniform recompute policy
        for member in [s, *variants]:
            own = strategy_lower_bound_s(ev, member, placement_bound(ev, member))
            assert bound <= own, member.short()
            if member.offload_activations and member.recompute != Recompute.PER_LAYER:
                assert bound <= offloaded <= own, member.short()
            for order in mesh_orders(member):
                so = replace(member, mesh_order=order)
                assert own <= ev.time(so).step_time_s, so.short()
        checked += 1
    assert checked >= 30


def _gpt3_plan() -> tuple[Evaluator, Strategy]:
    """gpt3-175b on 1024 A100s and the best plan of its top four with a uniform recompute
    (tests/test_search_plans_unchanged.py)."""
    ev = Evaluator(
        parse_model("gpt3-175b").to_profile(seq_len=2048),
        parse_cluster("1024xa100-80gb"),
        TrainConfig(global_batch=1536, seq_len=2048),
    )
    s = Strategy(
        dp=16,
        tp=4,
        pp=16,
        zero_stage=1,
        sequence_parallel=True,
        schedule=Schedule.DUALPIPEV,
        virtual_stages=2,
        micro_batch_size=2,
        recompute=Recompute.SELECTIVE,
    )
    return ev, s


def test_family_bound_is_not_vacuous():
    """It prices compute, recompute, TP and the bubble: within a few percent of the step time
    of a large-model member whose data-parallel terms are small."""
    ev, s = _gpt3_plan()
    assert ev.violation(s) is None
    bound = family_lower_bound_s(ev, family_key(s), ev.lower_bound_coll)
    assert 0.9 * ev.time(s).step_time_s < bound <= ev.time(s).step_time_s


SHAPES = [
    (Schedule.NONE, 1, [1, 3, 8], [1]),
    (Schedule.GPIPE, 4, [1, 4, 9], [1]),
    (Schedule.ONE_F_ONE_B, 3, [1, 2, 7, 12], [1]),
    (Schedule.INTERLEAVED_1F1B, 4, [4, 8, 16], [2, 3]),
    (Schedule.INTERLEAVED_ZB, 4, [4, 8, 16], [1, 2]),
    (Schedule.ZBV, 4, [1, 5, 8, 16], [2]),
    (Schedule.DUALPIPEV, 4, [8, 9, 16], [2]),
    (Schedule.DUALPIPEV, 8, [16, 32], [2]),
]


@pytest.mark.parametrize(("schedule", "pp", "ms", "vs"), SHAPES, ids=[str(x[0]) for x in SHAPES])
def test_makespan_equals_the_full_replay_bit_for_bit(schedule, pp, ms, vs):
    rng = random.Random(1)
    for m in ms:
        for v in vs:
            for _ in range(6):
                f = round(rng.random(), 3)
                share = round(rng.random(), 3)
                kwargs = dict(
                    num_stages=pp,
                    num_microbatches=m,
                    forward_s=f,
                    backward_s=1.0 - f,
                    virtual_stages=v,
                    weight_share=share,
                )
                full = simulate_pipeline(schedule, **kwargs).makespan_s
                assert makespan_s(schedule, **kwargs) == full


def test_makespan_rejects_what_the_replay_rejects():
    with pytest.raises(ValueError, match="multiple of pp"):
        makespan_s(
            Schedule.INTERLEAVED_1F1B,
            num_stages=4,
            num_microbatches=6,
            forward_s=1.0,
            backward_s=2.0,
            virtual_stages=2,
        )
    with pytest.raises(ValueError, match="weight_share"):
        makespan_s(
            Schedule.ZBV,
            num_stages=2,
            num_microbatches=4,
            forward_s=1.0,
            backward_s=2.0,
            virtual_stages=2,
            weight_share=1.5,
        )


@pytest.mark.parametrize("name", ["small-gpt-nodes-of-2", "tiny-moe-8xh100", "gpt3-175b-1024xa100"])
def test_placement_bound_is_below_every_orders_collectives(name):
    """Each collective priced by `PlacementBound` is at most the real one on the links every
    mesh order gives each group."""
    ev = _space_evaluator(name)
    blocks = list(Search(ev).blocks())
    rng = random.Random(7)
    for block in rng.sample(blocks, min(40, len(blocks))):
        s = block.base
        bound = placement_bound(ev, s)
        for order in mesh_orders(s):
            links = ev.links_in_order(s, order)
            for f in dataclasses.fields(links):
                link = getattr(links, f.name)
                ideal = AxisLink(link.size, link.size, 1)
                for nbytes in (1e3, 3e6, 1e9):
                    assert bound.all_reduce(nbytes, ideal) <= ev.coll.all_reduce(nbytes, link)
                    assert bound.all_gather(nbytes, ideal) <= ev.coll.all_gather(nbytes, link)
                    rs = ev.coll.reduce_scatter(nbytes, link)
                    assert bound.reduce_scatter(nbytes, ideal) <= rs
                    assert bound.all_to_all(nbytes, ideal) <= ev.coll.all_to_all(nbytes, link)
            for cross in (False, True):
                assert bound.p2p(1e7, False) <= ev.coll.p2p(1e7, cross)


def test_strategy_bound_is_tight_for_a_large_model():
    """The placement-priced bound of gpt3-175b's plan is within 2% of its best mesh order's
    step time (the fastest-link bound it replaced was 1-35% below)."""
    ev, s = _gpt3_plan()
    best = min(ev.time(replace(s, mesh_order=o)).step_time_s for o in mesh_orders(s))
    bound = strategy_lower_bound_s(ev, s, placement_bound(ev, s))
    assert 0.98 * best < bound <= best
