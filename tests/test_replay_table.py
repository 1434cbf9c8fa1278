"""The replays of `solvers/replay_table.py` equal `simulate_pipeline`'s, bit for bit."""

from __future__ import annotations

import random

import pytest

from paraplan.planner.cost.schedules import _reference_m, bubble_bound_s, bubble_s, fill_chain
from paraplan.planner.solvers.pipeline_replay import makespan_s, simulate_pipeline
from paraplan.planner.solvers.replay_table import (
    in_flight_peaks,
    makespan_at,
    makespan_bound,
    replay_makespan,
    replay_stages,
    replayed_peaks,
)
from paraplan.planner.strategy import Schedule

SHAPES = [
    (Schedule.GPIPE, 4, 1, 6),
    (Schedule.ONE_F_ONE_B, 4, 1, 5),
    (Schedule.INTERLEAVED_1F1B, 4, 3, 8),
    (Schedule.INTERLEAVED_ZB, 4, 1, 8),
    (Schedule.INTERLEAVED_ZB, 4, 2, 4),
    (Schedule.INTERLEAVED_ZB, 3, 3, 6),
    (Schedule.ZBV, 4, 2, 8),
    (Schedule.ZBV, 3, 2, 5),
    (Schedule.DUALPIPEV, 4, 2, 8),
    (Schedule.DUALPIPEV, 5, 2, 10),
    (Schedule.DUALPIPEV, 8, 2, 16),
]
FORWARDS = [0.0, 0.001, 0.25, 0.333, 0.4, 0.5, 0.777, 1.0]


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), SHAPES)
@pytest.mark.parametrize("share", [0.0, 0.5, 0.667])
def test_makespan_equals_the_replay(schedule, pp, v, m, share):
    for f in FORWARDS:
        want = makespan_s(
            schedule,
            num_stages=pp,
            num_microbatches=m,
            forward_s=f,
            backward_s=1.0 - f,
            virtual_stages=v,
            weight_share=share,
        )
        got = makespan_at(schedule, pp=pp, v=v, m=m, forward=f, share=share)
        assert got == want, (f, got, want)


def test_makespan_refuses_unrounded_shares():
    assert makespan_at(Schedule.ZBV, pp=4, v=2, m=8, forward=1.0 / 3.0, share=0.5) is None


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), SHAPES)
@pytest.mark.parametrize("pending", [0.0, 18.0 / 34.0])
def test_in_flight_peaks_equal_the_timeline(schedule, pp, v, m, pending):
    """Read off the stages' orders (every operation lasts) or replayed (some take no time:
    a weight share of 0 or 1, a forward of 0), as the timeline's sorted events."""
    rng = random.Random(f"peaks{schedule}{pp}{v}{m}")
    cases = [(1.0 / 3.0, 2.0 / 3.0, 0.5), (0.0, 1.0, 0.5), (1.0 / 3.0, 2.0 / 3.0, 0.0)]
    cases += [(1.0 / 3.0, 2.0 / 3.0, 1.0), (0.25, 0.75, 0.667), (1e-30, 1.0, 0.5)]
    cases += [(rng.uniform(0.01, 1), rng.uniform(0.01, 2), rng.random()) for _ in range(4)]
    for f, b, share in cases:
        t = simulate_pipeline(
            schedule,
            num_stages=pp,
            num_microbatches=m,
            forward_s=f,
            backward_s=b,
            virtual_stages=v,
            weight_share=share,
        )
        want = tuple(t.in_flight(s, pending) for s in range(pp))
        assert in_flight_peaks(schedule, pp, v, m, f, b, share, pending) == want, (f, b, share)
        assert replayed_peaks(schedule, pp, v, m, f, b, share, pending) == want, (f, b, share)


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), SHAPES)
@pytest.mark.parametrize("pending", [0.0, 18.0 / 34.0])
def test_stage_replay_equals_the_timeline(schedule, pp, v, m, pending):
    """Unequal stages (some alike, one idle): the makespan and every stage's in-flight peak."""
    rng = random.Random(f"{schedule}{pp}{v}{m}")
    for share in (0.0, 0.5, 0.667, 1.0):
        fwd = [rng.choice((0.0, 0.1, 1.0 / 3.0, rng.uniform(0.05, 2.0))) for _ in range(pp)]
        bwd = [rng.choice((0.2, 2.0 / 3.0, rng.uniform(0.05, 4.0))) for _ in range(pp)]
        t = simulate_pipeline(
            schedule,
            num_stages=pp,
            num_microbatches=m,
            forward_s=fwd,
            backward_s=bwd,
            virtual_stages=v,
            weight_share=share,
        )
        want = (t.makespan_s, tuple(t.in_flight(s, pending) for s in range(pp)))
        got = replay_stages(
            schedule,
            pp=pp,
            v=v,
            m=m,
            forward_s=fwd,
            backward_s=bwd,
            share=share,
            pending_weight=pending,
        )
        assert got == want, (share, fwd, bwd)
        alone = dict(pp=pp, v=v, m=m, forward_s=fwd, backward_s=bwd, share=share)
        assert replay_makespan(schedule, **alone) == t.makespan_s, (share, fwd, bwd)
        assert replay_makespan(schedule, **alone) == t.makespan_s  # the kept answer


SPLIT = [
    (schedule, pp, v)
    for schedule, pps, vs in (
        (Schedule.INTERLEAVED_ZB, (2, 3, 4, 8, 16), (1, 2, 3)),
        (Schedule.ZBV, (2, 3, 4, 8, 16), (2,)),
        (Schedule.DUALPIPEV, (2, 3, 4, 8, 16), (2,)),
    )
    for pp in pps
    for v in vs
]


@pytest.mark.parametrize(("schedule", "pp", "v"), SPLIT)
def test_fill_chain_bounds_the_makespan(schedule, pp, v):
    """The chain the search's bubble bound prices is one of the graph's: its length never
    exceeds the replayed makespan, at any F:B:W, for any micro-batch count replayed."""
    for m in sorted({_reference_m(schedule, pp, k * pp) for k in (1, 2, 3, 4)}):
        chain = fill_chain(pp, v, m)
        for share in (0.0, 0.5, 0.667, 1.0):
            for f in [*FORWARDS, 0.1, 0.7]:
                exact = makespan_at(schedule, pp=pp, v=v, m=m, forward=f, share=share)
                assert makespan_bound([chain], v=v, forward=f, share=share) <= exact


def test_bubble_bound_is_below_the_bubble():
    for schedule, pp, v in SPLIT:
        for m in (pp, 2 * pp, 4 * pp):
            kw = dict(pp=pp, virtual_stages=v, num_microbatches=m, weight_share=0.5)
            for fwd in (0.2, 0.3, 0.31, 0.45):
                got = bubble_bound_s(schedule, forward_s=fwd, backward_s=1.0, **kw)
                assert 0.0 <= got <= bubble_s(schedule, forward_s=fwd, backward_s=1.0, **kw)
