"""The checkpointing DP: equal to brute force over its whole schedule space on every chain up
to 10 layers, its claims equal the simulator's replay, never worse than the uniform policies,
and honest about budgets nothing fits (fast, CPU only; the 10-layer case is marked slow)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from paraplan.planner.solvers import (
    Backward,
    ChainLayer,
    Forward,
    LayerChain,
    Op,
    Policy,
    SolveStatus,
    chain_to_graph,
    simulate,
    solve_checkpoint_dp,
    uniform_schedule,
)


def random_chain(n: int, rng: random.Random, *, integer: bool = True) -> LayerChain:
    """Heterogeneous costs: sizes in small integers (exact for 1-byte units) or floats."""

    def size(lo: int, hi: int) -> float:
        return float(rng.randint(lo, hi)) if integer else rng.uniform(lo, hi)

    xs = [size(1, 6) for _ in range(n + 1)]
    return LayerChain(
        layers=tuple(
            ChainLayer(
                name=f"l{i}",
                fwd_s=rng.uniform(1, 3),
                bwd_s=rng.uniform(2, 5),
                input_bytes=xs[i],
                saved_bytes=xs[i] + size(0, 9),
                output_bytes=xs[i + 1],
                fwd_tmp_bytes=size(0, 3),
                bwd_tmp_bytes=size(0, 3),
            )
            for i in range(n)
        ),
        name=f"random{n}",
    )


def persistent_schedules(s: int, t: int) -> Iterator[list[Op]]:
    """Every schedule of Rotor's space for layers s..t (1-based graph nodes), written out from
    its definition: a single layer runs F_all then B; otherwise either store all of layer s
    (F_all s, the rest, B s) or run s..s'-1 keeping only the input, solve s'..t, then s..s'-1."""
    if s == t:
        yield [Forward(node=s), Backward(node=s)]
        return
    for rest in persistent_schedules(s + 1, t):
        yield [Forward(node=s), *rest, Backward(node=s)]
    for sp in range(s + 1, t + 1):
        run: list[Op] = [Forward(node=k, keep_saved=False) for k in range(s, sp)]
        rights = list(persistent_schedules(sp, t))
        for left in persistent_schedules(s, sp - 1):
            for right in rights:
                yield run + right + left


def brute_force(chain: LayerChain) -> list[tuple[float, float]]:
    """(peak, makespan) of every schedule, replayed by the simulator."""
    graph = chain_to_graph(chain)
    out = []
    for ops in persistent_schedules(1, len(chain)):
        result = simulate(graph, ops)
        out.append((result.peak_bytes, result.makespan_s))
    return out


def check_against_brute_force(chain: LayerChain) -> None:
    results = brute_force(chain)
    least = min(peak for peak, _ in results)
    most = max(peak for peak, _ in results)
    for budget in range(int(least) - 2, int(most) + 2):
        best = min((time for peak, time in results if peak <= budget), default=None)
        solution = solve_checkpoint_dp(chain, budget, unit_bytes=1.0)
        if best is None:
            assert solution.status == SolveStatus.INFEASIBLE
            assert solution.min_budget_bytes == least
            assert solution.ops == () and solution.makespan_s is None
            continue
        assert solution.status == SolveStatus.OPTIMAL
        assert solution.makespan_s == pytest.approx(best, rel=1e-12)
        replay = simulate(chain, solution.ops)
        assert replay.peak_bytes == pytest.approx(solution.peak_bytes, rel=1e-12)
        assert replay.makespan_s == pytest.approx(solution.makespan_s, rel=1e-12)
        assert replay.peak_bytes <= budget


@pytest.mark.parametrize("layers", range(1, 9))
@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_brute_force(layers: int, seed: int) -> None:
    check_against_brute_force(random_chain(layers, random.Random(100 * layers + seed)))


def test_dp_equals_brute_force_nine_layers() -> None:
    check_against_brute_force(random_chain(9, random.Random(9)))


@pytest.mark.slow
def test_dp_equals_brute_force_ten_layers() -> None:
    check_against_brute_force(random_chain(10, random.Random(10)))


@pytest.mark.parametrize("seed", range(6))
def test_dp_never_worse_than_uniform_policies(seed: int) -> None:
    """Default discretization (sizes not multiples of the unit): the DP still beats or ties
    every uniform policy that fits, and what it claims is what the simulator measures."""
    rng = random.Random(seed)
    chain = random_chain(rng.randint(6, 16), rng, integer=False)
    baselines = {p: simulate(chain, uniform_schedule(chain, p)) for p in Policy}
    least = solve_checkpoint_dp(chain, 1.0).min_budget_bytes
    top = baselines[Policy.STORE_ALL].peak_bytes
    for step in range(12):
        budget = least + (top * 1.05 - least) * step / 11
        solution = solve_checkpoint_dp(chain, budget, num_units=60)
        assert solution.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
        assert solution.makespan_s is not None and solution.peak_bytes is not None
        replay = simulate(chain, solution.ops)
        assert replay.peak_bytes == pytest.approx(solution.peak_bytes, rel=1e-12)
        assert replay.makespan_s == pytest.approx(solution.makespan_s, rel=1e-12)
        assert replay.peak_bytes <= budget * (1 + 1e-12)
        for result in baselines.values():
            if result.peak_bytes <= budget:
                assert solution.makespan_s <= result.makespan_s * (1 + 1e-12)


def test_uniform_policies_match_their_definitions() -> None:
    chain = random_chain(7, random.Random(3))

    def names(ops):
        return [(type(op).__name__[0], op.node, getattr(op, "keep_saved", None)) for op in ops]

    full = uniform_schedule(chain, Policy.FULL_RECOMPUTE)
    assert names(full[:7]) == [("F", k, k == 7) for k in range(1, 8)]
    assert names(full[7:9]) == [("B", 7, None), ("F", 6, True)]
    # checkpoint_sequential(7 layers, 3 segments): [1,2] [3,4] checkpointed, [5..7] normal
    seq = uniform_schedule(chain, Policy.SQRT_SEGMENTS)
    assert [op.keep_saved for op in seq[:7]] == [False] * 4 + [True] * 3
    assert names(seq[10:14]) == [("F", 3, True), ("F", 4, True), ("B", 4, None), ("B", 3, None)]
    assert simulate(chain, uniform_schedule(chain, Policy.STORE_ALL)).recompute_s == 0.0


def test_infeasible_budget_says_the_smallest_that_works() -> None:
    chain = random_chain(6, random.Random(1), integer=False)
    solution = solve_checkpoint_dp(chain, 1.0)
    assert solution.status == SolveStatus.INFEASIBLE
    assert "smallest peak any schedule reaches is" in solution.message
    assert "raise the budget" in solution.message
    enough = solve_checkpoint_dp(chain, solution.min_budget_bytes)
    assert enough.status != SolveStatus.INFEASIBLE
    assert simulate(chain, enough.ops).peak_bytes <= solution.min_budget_bytes * (1 + 1e-12)


def test_large_tables_in_float32_still_replay_exactly() -> None:
    chain = random_chain(30, random.Random(5), integer=False)
    top = simulate(chain, uniform_schedule(chain, Policy.STORE_ALL)).peak_bytes
    solution = solve_checkpoint_dp(chain, 0.4 * top, num_units=10_000)  # 4.5M cells: float32
    replay = simulate(chain, solution.ops)
    assert replay.peak_bytes == pytest.approx(solution.peak_bytes, rel=1e-12)
    assert replay.peak_bytes <= 0.4 * top
    assert replay.makespan_s == pytest.approx(solution.makespan_s, rel=1e-12)
    coarse = solve_checkpoint_dp(chain, 0.4 * top, num_units=500)
    assert solution.makespan_s <= coarse.makespan_s * (1 + 1e-6)  # finer units never lose


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"budget_bytes": -1.0}, ["budget_bytes=-1.0", ">= 0"]),
        ({"budget_bytes": 10.0, "num_units": 0}, ["num_units=0", "1..100000"]),
        ({"budget_bytes": 10.0, "unit_bytes": -2.0}, ["unit_bytes=-2.0", "> 0"]),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        solve_checkpoint_dp(random_chain(3, random.Random(0)), **kwargs)
    for word in words:
        assert word in str(err.value)
