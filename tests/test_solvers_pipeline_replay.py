"""The pipeline replay (`planner/solvers/pipeline_replay.py`): equal stages reproduce the cost
model's pipeline time, bubble and in-flight micro-batches; uneven stages with p2p keep every
dependency; bad schedules are refused."""

from __future__ import annotations

import itertools

import pytest

from paraplan.planner.cost.memory import in_flight_microbatches
from paraplan.planner.solvers.pipeline_replay import Phase, simulate_pipeline
from paraplan.planner.strategy import Schedule

CASES = [
    *((Schedule.NONE, 1, m, 1) for m in (1, 3)),
    *(
        (s, pp, m, 1)
        for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)
        for pp in (2, 3, 4)
        for m in (1, 2, 5, 8)
    ),
    *(
        (Schedule.INTERLEAVED_1F1B, pp, k * pp, v)
        for pp in (2, 4)
        for k in (1, 2, 3)
        for v in (2, 3)
    ),
]
"""(schedule, pp, m, v): m below, at and above pp; interleaving needs m a multiple of pp."""


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), CASES)
@pytest.mark.parametrize(("fwd_s", "bwd_s"), [(1.0, 2.0), (0.7, 1.1)])
def test_uniform_stages_match_the_cost_model(schedule, pp, m, v, fwd_s, bwd_s) -> None:
    """Equal stages, no p2p: makespan (m + (pp-1)/v) slots and bubble (pp-1)/v of them
    (planner/cost/evaluate.py), in-flight micro-batches as planner/cost/memory.py counts."""
    t = simulate_pipeline(
        schedule,
        num_stages=pp,
        num_microbatches=m,
        forward_s=fwd_s,
        backward_s=bwd_s,
        virtual_stages=v,
    )
    slots = m + (pp - 1) / v
    assert t.makespan_s == pytest.approx(slots * (fwd_s + bwd_s), rel=1e-12)
    assert t.bubble_fraction == pytest.approx(((pp - 1) / v) / slots, rel=1e-12)
    for s in range(pp):
        expected = in_flight_microbatches(
            schedule, pp=pp, stage=s, num_microbatches=m, virtual_stages=v
        )
        assert t.in_flight(s) == pytest.approx(expected), (s, t.in_flight(s), expected)


@pytest.mark.parametrize(
    ("schedule", "v", "m"),
    [(Schedule.GPIPE, 1, 6), (Schedule.ONE_F_ONE_B, 1, 6), (Schedule.INTERLEAVED_1F1B, 2, 6)],
)
def test_dependencies_hold_with_uneven_stages_and_p2p(schedule, v, m) -> None:
    """Every (phase, micro-batch, chunk) runs once; a forward starts after the previous
    chunk's forward has arrived, a backward after the next chunk's backward (the last chunk's
    after its own forward); a stage never runs two operations at once."""
    pp, p2p = 3, 0.05
    t = simulate_pipeline(
        schedule,
        num_stages=pp,
        num_microbatches=m,
        forward_s=[1.0, 1.5, 0.8],
        backward_s=[2.2, 2.9, 1.4],
        virtual_stages=v,
        p2p_s=p2p,
    )
    ops = {(x.phase, x.microbatch, x.chunk): x for x in t.intervals}
    chunks = pp * v
    assert len(ops) == len(t.intervals) == 2 * m * chunks
    for (phase, mb, c), x in ops.items():
        assert x.stage == c % pp
        if phase == Phase.FORWARD and c > 0:
            prev = ops[(Phase.FORWARD, mb, c - 1)]
            assert x.start_s >= prev.end_s + p2p - 1e-12
        if phase == Phase.BACKWARD:
            if c < chunks - 1:
                assert x.start_s >= ops[(Phase.BACKWARD, mb, c + 1)].end_s + p2p - 1e-12
            assert x.start_s >= ops[(Phase.FORWARD, mb, c)].end_s - 1e-12
    for s in range(pp):
        mine = sorted(t.stage_intervals(s), key=lambda x: x.start_s)
        for a, b in itertools.pairwise(mine):
            assert b.start_s >= a.end_s - 1e-12
    assert t.makespan_s > (m + (pp - 1) / v) * 3.0  # stalls behind the slowest stage and p2p


def test_replay_rejects_bad_schedules() -> None:
    kw = {"forward_s": 1.0, "backward_s": 2.0}
    with pytest.raises(ValueError, match="multiple of pp"):
        simulate_pipeline(
            "interleaved_1f1b", num_stages=4, num_microbatches=6, virtual_stages=2, **kw
        )
    with pytest.raises(ValueError, match="v > 1 exactly with interleaved_1f1b"):
        simulate_pipeline("1f1b", num_stages=2, num_microbatches=4, virtual_stages=2, **kw)
    with pytest.raises(ValueError, match="needs pp >= 2"):
        simulate_pipeline("gpipe", num_stages=1, num_microbatches=4, **kw)
    with pytest.raises(ValueError, match="one per stage"):
        simulate_pipeline(
            "gpipe", num_stages=3, num_microbatches=4, forward_s=[1.0, 1.0], backward_s=2.0
        )
