"""The pipeline partition DP against brute force over every contiguous split (fast, CPU only)."""

from __future__ import annotations

import itertools
import random

import pytest

from paraplan.planner.solvers import SolveStatus, in_flight_per_stage, partition_layers
from paraplan.planner.strategy import Schedule


def splits(layers: int, stages: int):  # type: ignore[no-untyped-def]
    """Every split of `layers` into `stages` non-empty contiguous ranges."""
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        yield list(itertools.pairwise(bounds))


@pytest.mark.parametrize("seed", range(40))
def test_partition_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    layers = rng.randint(1, 9)
    stages = rng.randint(1, min(layers, 4))
    times = [rng.uniform(0.5, 3) for _ in range(layers)]
    static = [float(rng.randint(1, 5)) for _ in range(layers)]
    act = [float(rng.randint(0, 4)) for _ in range(layers)]
    flight = [float(rng.randint(1, 4)) for _ in range(stages)]
    per_stage = rng.random() < 0.5
    limits = [float(rng.randint(5, 40)) for _ in range(stages)] if per_stage else None
    limit = float(rng.randint(5, 40))

    def memory(k: int, i: int, j: int) -> float:
        return sum(static[i:j]) + flight[k] * sum(act[i:j])

    best, least = None, None
    for parts in splits(layers, stages):
        peak = max(memory(k, i, j) for k, (i, j) in enumerate(parts))
        least = peak if least is None else min(least, peak)
        fits = all(memory(k, i, j) <= (limits[k] if limits else limit)
                   for k, (i, j) in enumerate(parts))  # fmt: skip
        if fits:
            slowest = max(sum(times[i:j]) for i, j in parts)
            best = slowest if best is None else min(best, slowest)
    solution = partition_layers(times, static, act, num_stages=stages,
                                memory_limit_bytes=limits if limits else limit,
                                in_flight=flight)  # fmt: skip
    assert solution.min_memory_bytes == pytest.approx(least)
    if best is None:
        assert solution.status == SolveStatus.INFEASIBLE
        assert solution.bottleneck_s is None and solution.stages == ()
        assert "raise the limit" in solution.message
        return
    assert solution.status == SolveStatus.OPTIMAL
    assert solution.bottleneck_s == pytest.approx(best)
    parts = solution.stages
    assert parts[0][0] == 0 and parts[-1][1] == layers
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise([*parts, (layers, 0)]))
    for k, (i, j) in enumerate(parts):
        assert solution.stage_times_s[k] == pytest.approx(sum(times[i:j]))
        assert solution.stage_memory_bytes[k] == pytest.approx(memory(k, i, j))
        assert memory(k, i, j) <= (limits[k] if limits else limit)


def test_in_flight_follows_the_schedule() -> None:
    assert in_flight_per_stage(Schedule.ONE_F_ONE_B, num_stages=4, num_microbatches=3) == (
        3.0, 3.0, 2.0, 1.0)  # fmt: skip
    assert in_flight_per_stage(Schedule.GPIPE, num_stages=2, num_microbatches=8) == (8.0, 8.0)


def test_1f1b_puts_fewer_layers_on_the_first_stage_when_memory_binds() -> None:
    flight = in_flight_per_stage(Schedule.ONE_F_ONE_B, num_stages=4, num_microbatches=8)
    solution = partition_layers([1.0] * 16, [1.0] * 16, [1.0] * 16, num_stages=4,
                                memory_limit_bytes=18.0, in_flight=flight)  # fmt: skip
    sizes = [j - i for i, j in solution.stages]
    assert sizes[0] < sizes[-1]  # stage 0 holds 4 micro-batches, the last one 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_stages": 5}, ["num_stages=5", "from 1 to the 3 layers"]),
        ({"layer_times_s": [1.0, -1.0, 1.0]}, ["layer_times_s[1]=-1.0", ">= 0"]),
        ({"in_flight": [1.0]}, ["in_flight has 1 entries, expected 2"]),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict, words: list[str]) -> None:
    args = dict(layer_times_s=[1.0, 2.0, 3.0], static_bytes=[1.0] * 3, act_bytes=[1.0] * 3,
                num_stages=2, memory_limit_bytes=10.0, in_flight=[1.0, 1.0])  # fmt: skip
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        partition_layers(**args)  # type: ignore[arg-type]
    for word in words:
        assert word in str(err.value)
