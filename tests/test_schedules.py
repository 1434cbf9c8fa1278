"""Zero-bubble and bidirectional schedules: torch's orders, the papers' bubbles, the planner.

- The planner's per-stage orders (planner/solvers/pipeline_orders.py) equal torch 2.13's
  `_calculate_single_rank_operations` for ZB1P, ZB-V and DualPipeV.
- The replay of those orders reproduces the bubbles the papers state: 1F1B (p-1)(F+B+W) and
  ZB-H1 (p-1)(F+B-W) (Qi et al. 2023, arXiv 2401.10241 §2.1), ZB-V's zero in-span bubble at
  F = B = W (Qi et al. §6), and stays within DualPipe's (PP/2-1)(F&B+B-3W) (DeepSeek-V3,
  arXiv 2412.19437 Table 2).
- With pp=8 pinned and few micro-batches the search picks a split-backward schedule.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.planner.api import make_plan
from paraplan.planner.capabilities import Job, executor_gaps, plan_gaps
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.layout import p2p_sends
from paraplan.planner.cost.schedules import (
    PENDING_W_ACT_FACTOR,
    bubble_s,
    in_flight_microbatches,
)
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.plan_io import check_plan, load_plan, save_plan
from paraplan.planner.search import Search
from paraplan.planner.solvers.pipeline_orders import (
    Phase,
    dualpipev_order,
    interleaved_zb_order,
    zbv_order,
)
from paraplan.planner.solvers.pipeline_replay import simulate_pipeline
from paraplan.planner.strategy import Schedule

PMS = [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)]
"""(pipeline stages p, micro-batches m) the formulas are checked at."""


def _torch_order(cls: type, pp: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's order for one rank, without building stages or a process group."""
    o = object.__new__(cls)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = pp, m, v
    o.number_of_rounds = max(1, m // pp)
    o.microbatches_per_round = m // o.number_of_rounds
    o.num_stages = o._num_stages = pp * v
    looped = cls.__name__ == "ScheduleInterleavedZeroBubble"
    out = []
    for a in o._calculate_single_rank_operations(rank):
        if a is None:
            continue
        for x in a.sub_actions or (a,):
            local = x.stage_index // pp if looped else int(x.stage_index >= pp)
            out.append((str(x.computation_type.value), x.microbatch_index, local))
    return out


_LETTER = {
    Phase.FORWARD: "F",
    Phase.BACKWARD: "B",
    Phase.BACKWARD_INPUT: "I",
    Phase.BACKWARD_WEIGHT: "W",
}


def _letters(order: list[tuple[Phase, int, int]]) -> list[tuple[str, int, int]]:
    return [(_LETTER[p], k, c) for p, k, c in order]


def test_orders_equal_torch() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 3 * pp):
            for v in (1, 2, 3):
                for r in range(pp):
                    want = _torch_order(schedules.ScheduleInterleavedZeroBubble, pp, m, v, r)
                    assert _letters(interleaved_zb_order(pp, m, v, r)) == want, (pp, m, v, r)
        for m in range(1, 3 * pp + 2):
            for r in range(pp):
                want = _torch_order(schedules.ScheduleZBVZeroBubble, pp, m, 2, r)
                assert _letters(zbv_order(pp, m, r)) == want, (pp, m, r)
        for m in range(2 * pp, 4 * pp + 2):
            for r in range(pp):
                want = _torch_order(schedules.ScheduleDualPipeV, pp, m, 2, r)
                assert _letters(dualpipev_order(pp, m, r)) == want, (pp, m, r)


def _bubble(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """Makespan minus the work of one stage, for chunk times f (forward), b (input gradient)
    and w (weight gradient)."""
    t = simulate_pipeline(
        schedule,
        num_stages=p,
        num_microbatches=m,
        forward_s=f * v,
        backward_s=(b + w) * v,
        virtual_stages=v,
        weight_share=w / (b + w),
    )
    return t.makespan_s - m * v * (f + b + w)


@pytest.mark.parametrize(("p", "m"), PMS)
def test_bubbles_match_the_papers(p: int, m: int) -> None:
    for f, b, w in ((1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.5, 0.3)):
        # 1F1B: (p-1)(F+B+W), Qi et al. 2023 §2 (Narayanan et al. 2021 §2.2.1)
        assert _bubble("1f1b", p, m, 1, f, b, w) == pytest.approx((p - 1) * (f + b + w))
        # ZB-H1: (p-1)(F+B-W), Qi et al. 2023 §2.1; interleaved: the same in chunk times
        for v in (1, 2):
            got = _bubble("interleaved_zb", p, m, v, f, b, w)
            assert got == pytest.approx((p - 1) * (f + b - w)), (f, b, w, v)
        if m >= 2 * p:  # DualPipe's bound with F&B = F + (B+W), unoverlapped
            bound = (p - 1) * ((f + b + w) + (b + w) - 3 * w)
            assert _bubble("dualpipev", p, m, 2, f, b, w) <= bound + 1e-9
    # ZB-V, F = B = W: no stage idles inside its own span (Qi et al. §6); the makespan adds
    # the last stage's late start, (p-1) chunk forwards
    t = simulate_pipeline(
        "zbv", num_stages=p, num_microbatches=m, forward_s=2, backward_s=4, virtual_stages=2
    )
    for s in range(p):
        ops = t.stage_intervals(s)
        span = ops[-1].end_s - ops[0].start_s
        assert span == pytest.approx(t.busy_s(s))
    assert t.makespan_s - m * 6 == pytest.approx(p - 1)


def test_bubble_no_longer_depends_on_m_past_2p() -> None:
    """What lets the cost model replay min(m, 2p) micro-batches (cost/schedules.py)."""
    for sched, v in (("interleaved_zb", 1), ("interleaved_zb", 2), ("zbv", 2), ("dualpipev", 2)):
        for p in (2, 4, 8):
            got = {round(_bubble(sched, p, m, v, 1.0, 1.5, 0.3), 9) for m in (2 * p, 3 * p, 5 * p)}
            assert len(got) == 1, (sched, p, got)


def test_cost_model_bubble_and_memory_match_replay() -> None:
    for p, m in PMS:
        got = bubble_s(
            Schedule.INTERLEAVED_ZB,
            pp=p,
            virtual_stages=1,
            num_microbatches=m,
            forward_s=1.0,
            backward_s=2.0,
            weight_share=0.5,
        )
        # ZB-H1 at F = B = W = 1; the cost model rounds F:B to 1e-3 for its cache
        assert got == pytest.approx((p - 1) * 1.0, rel=2e-3)
        # ZB-H1 holds no more than 1F1B's p micro-batches (Qi et al. §2.1) plus the pending
        # weight gradients' output gradients on the stages that defer them
        first = in_flight_microbatches(
            Schedule.INTERLEAVED_ZB, pp=p, stage=0, num_microbatches=m, virtual_stages=1
        )
        assert p <= first <= p + PENDING_W_ACT_FACTOR + 1e-9  # one W pending at most
        t = simulate_pipeline(
            "interleaved_zb", num_stages=p, num_microbatches=m * 3, forward_s=1, backward_s=2
        )
        assert max(t.in_flight(s) for s in range(p)) == pytest.approx(p)


def test_search_picks_a_split_backward_schedule_with_few_microbatches() -> None:
    """pp=8 and m=16: 1F1B's fill costs 7 of 23 slots; zero bubble cuts it (ZB-H1 to about a
    third), and the small GPT fits either way."""
    spec = parse_model("gpt:layers=32,hidden=1024,heads=16,vocab=32000,seq=1024")
    ev = Evaluator(
        spec.to_profile(seq_len=1024),
        parse_cluster("8xh100"),
        TrainConfig(global_batch=16, seq_len=1024),
    )
    pins = Pins.parse("pp=8,dp=1,tp=1,mbs=1")
    best = Search(ev, pins).run().ranked[0]
    assert best.strategy.schedule in (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV), (
        best.strategy.short()
    )
    one = [e for e in Search(ev, Pins.parse("pp=8,dp=1,tp=1,mbs=1,schedule=1f1b")).run().ranked]
    assert best.step_time_s < one[0].step_time_s
    assert best.time.bubble_s < one[0].time.bubble_s / 2


def _gpt_evaluator(pp: int = 4, batch: int = 16) -> Evaluator:
    spec = parse_model("gpt:layers=32,hidden=1024,heads=16,vocab=32000,seq=1024")
    return Evaluator(
        spec.to_profile(seq_len=1024),
        parse_cluster("8xh100"),
        TrainConfig(global_batch=batch, seq_len=1024),
    )


@pytest.mark.parametrize("schedule", [Schedule.ZBV, Schedule.DUALPIPEV])
def test_v_schedules_place_chunks_in_a_v(schedule: Schedule) -> None:
    """ZB-V and DualPipeV: chunk c on stage c, then back (torch's style="v": 0 1 2 3 3 2 1 0
    for pp=4), so stage 0 runs the embedding and the head (no second copy of GPT's tied
    matrix), and the V's ends and turn need no send: 2 sends per micro-batch on the first
    and last stage, 4 on the others (a loop with v=2: 3 on the ends)."""
    ev = _gpt_evaluator()
    (est,) = Search(ev, Pins.parse(f"pp=4,dp=2,tp=1,mbs=1,schedule={schedule}")).run().ranked[:1]
    s = est.strategy
    sm = ev.stage_model
    chunks = sm.chunks(sm.layout_of(s))
    assert [c.stage for c in chunks] == [0, 1, 2, 3, 3, 2, 1, 0]
    stages = {st.index: st for st in sm.stages(sm.layout_of(s))}
    assert stages[0].has_embedding and stages[0].has_head
    profile = ev.profile
    first_and_last = [*range(chunks[0].first_layer, chunks[0].last_layer + 1)]
    first_and_last += [*range(chunks[-1].first_layer, chunks[-1].last_layer + 1)]
    assert stages[0].dense_params == sum(profile.layers[i].params for i in first_and_last)
    assert [p2p_sends(st, 8) for st in sorted(stages.values(), key=lambda x: x.index)] == [
        2 if st.index in (0, 3) else 4 for st in sorted(stages.values(), key=lambda x: x.index)
    ]
    loop = sm.chunks(sm.layout(4, 2, s.recompute, 1, False))
    assert [c.stage for c in loop] == [0, 1, 2, 3, 0, 1, 2, 3]
    loop_stages = sm.stages(sm.layout(4, 2, s.recompute, 1, False))
    assert p2p_sends(loop_stages[0], 8) == 3
    # the head's stage of the loop adds the tied embedding's copy, the V's does not
    last_loop = next(st for st in loop_stages if st.has_head)
    assert not last_loop.has_embedding
    loop_layers = sum(profile.layers[i].params for i in last_loop.layers)
    assert last_loop.dense_params == loop_layers + profile.vocab * profile.hidden


def test_v_schedules_are_runnable_and_round_trip(tmp_path: Path) -> None:
    """With the V placed, the executor's table no longer refuses ZB-V or DualPipeV, and the
    plan (chunks in a V) saves and loads; a loop placement under a V schedule is refused."""
    ev = _gpt_evaluator()
    pins = Pins.parse("pp=8,dp=1,tp=1,mbs=1,schedule=zbv")
    runnable = Search(ev, pins, runnable_only=True).run().ranked[0]
    assert runnable.strategy.schedule == Schedule.ZBV
    assert runnable.strategy.virtual_stages == 2
    outcome = make_plan(
        ev.profile, ev.cluster, ev.train, pins=Pins.parse("pp=4,dp=2,tp=1,schedule=dualpipev")
    )
    plan = outcome.plan
    assert plan.schedule == Schedule.DUALPIPEV and not plan_gaps(plan)
    assert [[c.chunk for c in st.chunks] for st in plan.stages] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    save_plan(plan, tmp_path / "v.json")
    assert load_plan(tmp_path / "v.json") == plan
    looped = replace(plan, schedule=Schedule.INTERLEAVED_ZB)
    with pytest.raises(ValueError, match="c % pp"):
        check_plan(looped)


def test_split_backward_schedules_refused_with_fsdp() -> None:
    """FSDP2 with a split backward gave wrong gradients on gloo: the executor's table refuses
    it (with the fix), and keeps replicated weights."""
    ev = _gpt_evaluator()
    for sched in ("zbv", "dualpipev", "interleaved_zb"):
        est = Search(ev, Pins.parse(f"pp=4,dp=2,tp=1,zero=3,schedule={sched}")).run().ranked[0]
        job = Job(
            strategy=est.strategy,
            experts=0,
            precision=ev.train.precision,
            optimizer=ev.train.optimizer,
        )
        (gap,) = executor_gaps(job)
        assert "FSDP" in gap and "--fix zero=1" in gap, gap
        plain = replace(est.strategy, zero_stage=1, offload_optimizer=False)
        assert not executor_gaps(replace(job, strategy=plain)), sched
