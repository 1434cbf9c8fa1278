"""The replays of `solvers/replay_table.py` equal `simulate_pipeline`'s, bit for bit."""

from __future__ import annotations

import pytest

from paraplan.planner.cost.schedules import bubble_bound_s, bubble_s
from paraplan.planner.solvers.pipeline_replay import makespan_s, simulate_pipeline
from paraplan.planner.solvers.replay_table import (
    critical_path,
    in_flight_peaks,
    makespan_at,
    makespan_bound,
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
    f, b, share = 1.0 / 3.0, 2.0 / 3.0, 0.5
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
    assert in_flight_peaks(schedule, pp, v, m, f, b, share, pending) == want


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), SHAPES)
@pytest.mark.parametrize("share", [0.0, 0.5, 0.667])
def test_critical_paths_bound_the_makespan_at_every_share(schedule, pp, v, m, share):
    """A critical path found at one forward share bounds the makespan at every other one
    (the search's bubble bounds), and at its own share it is the makespan (to the margin)."""
    paths = set()
    for f in FORWARDS:
        found = critical_path(schedule, pp=pp, v=v, m=m, forward=f, share=share)
        assert found is not None
        span, path = found
        assert span == makespan_at(schedule, pp=pp, v=v, m=m, forward=f, share=share)
        assert span * (1 - 1e-10) <= makespan_bound([path], v=v, forward=f, share=share) <= span
        paths.add(path)
    for f in [*FORWARDS, 0.1, 0.3, 0.6, 0.9]:
        exact = makespan_at(schedule, pp=pp, v=v, m=m, forward=f, share=share)
        assert makespan_bound(paths, v=v, forward=f, share=share) <= exact


def test_bubble_bound_is_below_the_bubble():
    """`bubble_bound_s` replays only when the search knows no path of the schedule, and is
    then the bubble itself; otherwise it is at most the bubble."""
    paths: dict = {}
    kw = dict(pp=8, virtual_stages=2, num_microbatches=32, weight_share=0.5)
    first = bubble_bound_s(Schedule.DUALPIPEV, forward_s=0.3, backward_s=0.7, paths=paths, **kw)
    assert first == bubble_s(Schedule.DUALPIPEV, forward_s=0.3, backward_s=0.7, **kw)
    assert len(paths) == 1
    for fwd in (0.2, 0.3, 0.31, 0.45):
        got = bubble_bound_s(Schedule.DUALPIPEV, forward_s=fwd, backward_s=1.0, paths=paths, **kw)
        assert got <= bubble_s(Schedule.DUALPIPEV, forward_s=fwd, backward_s=1.0, **kw)
    assert len(paths[next(iter(paths))]) == 1  # no replay once a path is known
