"""The rematerialization + offload ILP: equal to the DP on chains in Rotor's space, never worse
outside it, every claim equal to the simulator's replay, offload checked the same way, and
honest about budgets nothing fits (fast, CPU only)."""

from __future__ import annotations

import random

import pytest

from paraplan.planner.solvers import (
    Backward,
    ChainLayer,
    Forward,
    LayerChain,
    RematSolution,
    SolveStatus,
    gpt2_block_graph,
    simulate,
    solve_checkpoint_dp,
    solve_remat_ilp,
)

PROOF_S = 300.0
"""Solve limit in these tests: they assert proven optima, not speed, and a 10 s limit (the
default) was once reached under load (CBC then answers FEASIBLE). Each solve here takes < 1 s."""


def solve(model: LayerChain, budget: float, **kwargs: object) -> RematSolution:
    return solve_remat_ilp(model, budget, time_limit_s=PROOF_S, **kwargs)  # type: ignore[arg-type]


def random_chain(n: int, rng: random.Random) -> LayerChain:
    xs = [float(rng.randint(1, 6)) for _ in range(n + 1)]
    return LayerChain(
        layers=tuple(
            ChainLayer(
                name=f"l{i}",
                fwd_s=rng.uniform(1, 3),
                bwd_s=rng.uniform(2, 5),
                input_bytes=xs[i],
                saved_bytes=xs[i] + rng.randint(0, 9),
                output_bytes=xs[i + 1],
                fwd_tmp_bytes=float(rng.randint(0, 3)),
                bwd_tmp_bytes=float(rng.randint(0, 3)),
            )
            for i in range(n)
        )
    )


def assert_replays(model, solution, bw: float | None = None) -> None:  # type: ignore[no-untyped-def]
    replay = simulate(model, solution.ops, pcie_bytes_per_s=bw)
    assert replay.peak_bytes == pytest.approx(solution.peak_bytes, rel=1e-9)
    assert replay.makespan_s == pytest.approx(solution.makespan_s, rel=1e-9)
    assert replay.peak_bytes <= solution.budget_bytes * (1 + 1e-9)


def budgets(chain: LayerChain) -> list[float]:
    least = solve_checkpoint_dp(chain, 1.0).min_budget_bytes
    top = simulate(
        chain,
        [Forward(node=i) for i in range(1, len(chain) + 1)]
        + [Backward(node=i) for i in range(len(chain), 0, -1)],
    ).peak_bytes
    return sorted({float(round(least + (top - least) * k / 4)) for k in range(5)})


@pytest.mark.parametrize(("layers", "seed"), [(2, 0), (3, 1), (4, 2), (5, 3), (6, 4), (6, 5)])
def test_ilp_in_rotors_space_equals_the_dp_and_is_never_beaten_outside(
    layers: int, seed: int
) -> None:
    chain = random_chain(layers, random.Random(seed))
    for budget in budgets(chain):
        dp = solve_checkpoint_dp(chain, budget, unit_bytes=1.0)
        rotor = solve(chain, budget, persistent=True)
        free = solve(chain, budget)
        assert dp.status == rotor.status == free.status == SolveStatus.OPTIMAL
        assert rotor.makespan_s == pytest.approx(dp.makespan_s, rel=1e-9)
        assert free.makespan_s <= dp.makespan_s * (1 + 1e-9)
        assert_replays(chain, rotor)
        assert_replays(chain, free)


def test_dropping_a_checkpoint_can_beat_rotors_space() -> None:
    """Outside Rotor's persistent schedules the ILP may use a checkpoint, drop it and recompute
    it later; on this chain that is strictly faster, and the simulator agrees."""
    chain = random_chain(8, random.Random(0))
    found = False
    for budget in (26.0, 30.0, 34.0):
        dp = solve_checkpoint_dp(chain, budget, unit_bytes=1.0)
        free = solve(chain, budget)
        assert_replays(chain, free)
        found |= free.makespan_s < dp.makespan_s * (1 - 1e-6)
    assert found


@pytest.mark.parametrize("seed", range(3))
def test_offload_schedules_replay_exactly_and_never_lose(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(4, rng)
    bw = 2.0  # bytes/s: a transfer of a few bytes takes about one operation
    for budget in budgets(chain)[:3]:
        plain = solve(chain, budget)
        offload = solve(chain, budget, pcie_bytes_per_s=bw)
        assert offload.status == SolveStatus.OPTIMAL
        assert offload.makespan_s <= plain.makespan_s * (1 + 1e-6)
        assert_replays(chain, offload, bw)


def test_offload_makes_room_below_the_recompute_minimum() -> None:
    chain = random_chain(5, random.Random(7))
    least = solve(chain, 1.0)
    assert least.status == SolveStatus.INFEASIBLE and least.min_budget_bytes is not None
    with_offload = solve(chain, 1.0, pcie_bytes_per_s=1.0)
    assert with_offload.status == SolveStatus.INFEASIBLE
    assert with_offload.min_budget_bytes is not None
    assert with_offload.min_budget_bytes < least.min_budget_bytes
    slow = solve(chain, with_offload.min_budget_bytes, pcie_bytes_per_s=1.0)
    assert slow.status == SolveStatus.OPTIMAL
    assert_replays(chain, slow, 1.0)


def test_infeasible_budget_says_the_smallest_that_works() -> None:
    chain = random_chain(5, random.Random(2))
    solution = solve(chain, 3.0)
    assert solution.status == SolveStatus.INFEASIBLE and solution.ops == ()
    assert "smallest peak any schedule reaches is" in solution.message
    assert "allow offload" in solution.message
    assert solution.min_budget_bytes == solve_checkpoint_dp(chain, 3.0).min_budget_bytes
    assert solve(chain, solution.min_budget_bytes).status == SolveStatus.OPTIMAL


def test_gpt2_block_with_offload() -> None:
    graph = gpt2_block_graph(batch=1)
    everything = [Forward(node=i) for i in graph.compute_nodes]
    everything += [Backward(node=i) for i in reversed(graph.compute_nodes)]
    top = simulate(graph, everything).peak_bytes
    plain = solve_remat_ilp(graph, 0.81 * top)
    offload = solve_remat_ilp(graph, 0.81 * top, pcie_bytes_per_s=32e9, time_limit_s=30)
    assert plain.status == SolveStatus.OPTIMAL
    assert offload.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert offload.makespan_s <= plain.makespan_s * (1 + 1e-6)
    assert_replays(graph, plain)
    assert_replays(graph, offload, 32e9)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"budget_bytes": -1.0}, ["budget_bytes=-1.0", ">= 0"]),
        ({"budget_bytes": 9.0, "backend": "gurobi"}, ["backend='gurobi'", "cbc"]),
        ({"budget_bytes": 9.0, "pcie_bytes_per_s": 0.0}, ["pcie_bytes_per_s=0.0", "> 0"]),
        ({"budget_bytes": 9.0, "time_limit_s": 0.0}, ["time_limit_s=0.0", "> 0"]),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        solve_remat_ilp(random_chain(3, random.Random(0)), **kwargs)
    for word in words:
        assert word in str(err.value)


def test_highs_backend_agrees_with_cbc() -> None:
    chain = random_chain(5, random.Random(4))
    budget = budgets(chain)[1]
    cbc = solve(chain, budget, backend="cbc")
    highs = solve(chain, budget, backend="highs")
    assert highs.makespan_s == pytest.approx(cbc.makespan_s, rel=1e-9)
    assert_replays(chain, highs)
