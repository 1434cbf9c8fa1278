"""Trade-off curves: paraplan's DP and ILP never lose to a baseline that fits, a baseline fits
exactly when its simulated peak does, the √L baseline is what checkpoint_sequential does, and
budgets below the minimum say which budget works (fast, CPU only)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from paraplan.planner.model_spec import PRESETS
from paraplan.planner.solvers import (
    Backward,
    ChainLayer,
    Forward,
    LayerChain,
    Op,
    chain_from_profile,
    gpt2_layer_chain,
    simulate,
    solve_checkpoint_dp,
    sqrt_segment_starts,
    vgg16_chain,
)
from paraplan.planner.solvers import tradeoff as tradeoff_module
from paraplan.planner.solvers.tradeoff import (
    BASELINES,
    STRATEGIES,
    TradeoffCurve,
    baseline_schedule,
    default_budgets,
    tradeoff_curves,
)

TOL = 1e-9


def small_chain(n: int = 6, seed: int = 0) -> LayerChain:
    """A heterogeneous chain small enough for the ILP to prove optimality in well under 1 s."""
    rng = random.Random(seed)
    xs = [rng.uniform(1, 5) * 1e6 for _ in range(n + 1)]
    return LayerChain(
        layers=tuple(
            ChainLayer(
                name=f"l{i}",
                fwd_s=rng.uniform(1, 2) * 1e-3,
                bwd_s=rng.uniform(2, 4) * 1e-3,
                input_bytes=xs[i],
                saved_bytes=xs[i] + rng.uniform(0, 9) * 1e6,
                output_bytes=xs[i + 1],
                fwd_tmp_bytes=rng.uniform(0, 1) * 1e6,
            )
            for i in range(n)
        ),
        name=f"small{n}",
    )


def check_invariants(curves: tuple[TradeoffCurve, ...], budgets: list[float]) -> None:
    """Every point within its budget; DP/ILP feasible wherever a baseline is, and no slower."""
    by = {c.strategy: c.points for c in curves}
    for i, budget in enumerate(budgets):
        for points in by.values():
            p = points[i]
            assert p.budget_bytes == budget
            assert (p.makespan_s is None) == (p.peak_bytes is None) == (p.overhead is None)
            if p.peak_bytes is not None:
                assert p.peak_bytes <= budget * (1 + TOL)
        fitting = [
            by[s][i].overhead for s in BASELINES if s in by and by[s][i].overhead is not None
        ]
        for s in ("paraplan-dp", "paraplan-ilp"):
            if s not in by or not fitting:
                continue
            mine = by[s][i].overhead
            assert mine is not None, f"{s} infeasible at {budget} where a baseline fits"
            assert mine <= min(fitting) + TOL, (s, budget, mine, fitting)


@pytest.mark.parametrize("chain", [gpt2_layer_chain(), vgg16_chain()], ids=["gpt2", "vgg16"])
def test_dp_never_worse_than_a_fitting_baseline(chain: LayerChain) -> None:
    budgets = default_budgets(chain, 8)
    strategies = ("store-all", "sqrt-L", "full-recompute", "paraplan-dp")
    curves = tradeoff_curves(chain, budgets, strategies=strategies)
    assert [c.strategy for c in curves] == list(strategies)
    check_invariants(curves, budgets)
    dp = curves[-1].points
    assert dp[-1].overhead == 0.0  # the store-all peak fits: nothing recomputed
    overheads = [p.overhead for p in dp]
    assert all(a >= b - TOL for a, b in itertools.pairwise(overheads))  # more memory, no slower


@pytest.mark.parametrize(("layers", "pcie"), [(6, None), (4, 2e9)])
def test_dp_and_ilp_never_worse_than_a_fitting_baseline(layers: int, pcie: float | None) -> None:
    chain = small_chain(layers)  # (the offload model is larger: fewer layers keep it fast)
    budgets = default_budgets(chain, 5)
    curves = tradeoff_curves(chain, budgets, pcie_bytes_per_s=pcie, ilp_time_limit_s=20)
    assert [c.strategy for c in curves] == list(STRATEGIES)
    check_invariants(curves, budgets)
    by = {c.strategy: c.points for c in curves}
    for dp, ilp in zip(by["paraplan-dp"], by["paraplan-ilp"], strict=True):
        if ilp.status == "optimal" and dp.status == "optimal":
            # The ILP's space holds Rotor's (and, with a channel, offloads too).
            assert ilp.makespan_s <= dp.makespan_s * (1 + 1e-6)


@pytest.mark.parametrize(
    "chain", [gpt2_layer_chain(), vgg16_chain(), small_chain()], ids=["gpt2", "vgg16", "small"]
)
def test_a_baseline_fits_exactly_when_its_simulated_peak_does(chain: LayerChain) -> None:
    sims = {s: simulate(chain, baseline_schedule(chain, s)) for s in BASELINES}
    peaks = sorted(r.peak_bytes for r in sims.values())
    # Just below, at and just above each baseline's peak, and the curve's own budgets.
    budgets = [p * f for p in peaks for f in (1 - 1e-6, 1.0, 1 + 1e-6)] + default_budgets(chain)
    curves = tradeoff_curves(chain, budgets, strategies=tuple(BASELINES))
    ref = sims["store-all"].makespan_s
    for curve in curves:
        sim = sims[curve.strategy]
        for p in curve.points:
            fits = sim.peak_bytes <= p.budget_bytes * (1 + TOL)
            assert (p.status == "optimal") == fits
            if fits:
                assert (p.makespan_s, p.peak_bytes) == (sim.makespan_s, sim.peak_bytes)
                assert p.overhead == pytest.approx(sim.makespan_s / ref - 1, abs=1e-12)
                assert p.min_budget_bytes is None
            else:
                assert p.status == "infeasible" and p.makespan_s is None
                assert p.min_budget_bytes == sim.peak_bytes


def torch_segment_starts(num_layers: int, segments: int) -> list[int]:
    """1-based starts of checkpoint_sequential's segments, transcribed from torch 2.x
    (torch/utils/checkpoint.py): ``segment_size = len // segments``; checkpoint
    ``range(0, segment_size * (segments - 1), segment_size)``; the rest runs normally."""
    size = num_layers // segments
    starts = list(range(0, size * (segments - 1), size))
    end = starts[-1] + size - 1 if starts else -1
    return [s + 1 for s in starts] + [end + 2]


def recompute_runs(ops: list[Op]) -> list[list[int]]:
    """The runs of forwards after the first backward (the recomputed segments, in order)."""
    first = next(i for i, op in enumerate(ops) if isinstance(op, Backward))
    runs: list[list[int]] = []
    previous: Op | None = None
    for op in ops[first:]:
        if isinstance(op, Forward):
            if not isinstance(previous, Forward):
                runs.append([])
            runs[-1].append(op.node)
        previous = op
    return runs


@pytest.mark.parametrize("num_layers", [1, 2, 4, 7, 10, 14, 21, 50])
def test_sqrt_segments_are_checkpoint_sequentials(num_layers: int) -> None:
    k = max(1, round(num_layers**0.5))
    starts = torch_segment_starts(num_layers, k)
    assert sqrt_segment_starts(num_layers) == starts
    layer = ChainLayer(
        name="l", fwd_s=1.0, bwd_s=2.0, input_bytes=1.0, saved_bytes=3.0, output_bytes=1.0
    )
    chain = LayerChain(layers=(layer,) * num_layers)
    ops = baseline_schedule(chain, "sqrt-L")
    runs = recompute_runs(ops)
    # Checkpointed segments are recomputed last to first; the last segment is never recomputed.
    assert [run[0] for run in reversed(runs)] == starts[:-1]
    assert sorted(n for run in runs for n in run) == list(range(1, starts[-1]))


@pytest.mark.parametrize(("num_layers", "segments"), [(7, 2), (10, 3), (14, 4)])
def test_recomputation_order_matches_torch(num_layers: int, segments: int) -> None:
    pytest.importorskip("torch")
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    calls: list[int] = []

    class Logged(torch.nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, 2)
            calls.append(self.index + 1)  # 1-based, as chain_to_graph's nodes
            return self.lin(x)

    model = torch.nn.Sequential(*[Logged(i) for i in range(num_layers)])
    x = torch.randn(1, 2, requires_grad=True)
    checkpoint_sequential(model, segments, x, use_reentrant=True).sum().backward()
    layer = ChainLayer(
        name="l", fwd_s=1.0, bwd_s=2.0, input_bytes=1.0, saved_bytes=3.0, output_bytes=1.0
    )
    from paraplan.planner.solvers import Policy, uniform_schedule

    ops = uniform_schedule(
        LayerChain(layers=(layer,) * num_layers), Policy.SQRT_SEGMENTS, segments=segments
    )
    recomputed = [n for run in recompute_runs(ops) for n in run]
    assert calls[:num_layers] == list(range(1, num_layers + 1))
    assert calls[num_layers:] == recomputed


def test_budgets_below_the_minimum_say_what_works() -> None:
    chain = small_chain()
    least = solve_checkpoint_dp(chain, 0.0).min_budget_bytes
    curves = tradeoff_curves(chain, [0.5 * least, 0.99 * least])
    for curve in curves:
        for p in curve.points:
            assert p.status == "infeasible" and p.makespan_s is None and p.overhead is None
            assert p.min_budget_bytes is not None and p.min_budget_bytes > p.budget_bytes
    by = {c.strategy: c.points for c in curves}
    assert all(p.min_budget_bytes == least for p in by["paraplan-dp"])
    store_peak = simulate(chain, baseline_schedule(chain, "store-all")).peak_bytes
    assert all(p.min_budget_bytes == store_peak for p in by["store-all"])
    # The ILP's space holds the DP's, so its smallest budget is no larger.
    assert all(p.min_budget_bytes <= least * (1 + 1e-6) for p in by["paraplan-ilp"])


def test_default_budgets_span_smallest_feasible_to_store_all() -> None:
    chain = vgg16_chain()
    least = solve_checkpoint_dp(chain, 0.0).min_budget_bytes
    top = simulate(chain, baseline_schedule(chain, "store-all")).peak_bytes
    budgets = default_budgets(chain, 5)
    assert len(budgets) == 5
    assert budgets[0] == pytest.approx(least * 1.01) and budgets[-1] == pytest.approx(top)
    assert all(a < b for a, b in itertools.pairwise(budgets))
    assert default_budgets(chain, 1) == [top]
    assert default_budgets(chain, 3, low_margin=0.0)[0] == least


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda c: tradeoff_curves(c, [1e9], strategies=("rotor",)), ["rotor", "store-all"]),
        (lambda c: tradeoff_curves(c, [1e9], strategies="sqrt-L"), ["'sqrt-L'", "sequence"]),
        (lambda c: tradeoff_curves(c, [-1.0]), ["-1.0", ">= 0"]),
        (lambda c: tradeoff_curves(c, []), ["empty"]),
        (lambda c: default_budgets(c, 0), ["n=0", ">= 1"]),
        (lambda c: baseline_schedule(c, "paraplan-dp"), ["paraplan-dp", "baseline"]),
    ],
)
def test_bad_arguments_name_the_value(call, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        call(small_chain())
    for word in words:
        assert word in str(info.value)


def test_a_solver_claim_the_simulator_disagrees_with_is_caught(monkeypatch) -> None:
    real = tradeoff_module.solve_checkpoint_dp

    def lying(chain: LayerChain, budget: float, **kw):  # type: ignore[no-untyped-def]
        sol = real(chain, budget, **kw)
        return dataclasses.replace(sol, makespan_s=sol.makespan_s * 0.5)

    monkeypatch.setattr(tradeoff_module, "solve_checkpoint_dp", lying)
    chain = small_chain()
    with pytest.raises(RuntimeError, match="solver bug"):
        tradeoff_curves(chain, [1e12], strategies=("paraplan-dp",))


def test_chain_from_profile_uses_measured_times_and_transients() -> None:
    profile = PRESETS["gpt2"].to_profile(128)
    with pytest.raises(ValueError, match="no measured layer times"):
        chain_from_profile(profile)
    # Transients (a traced profile has them; the spec's are 0) scale with the micro-batch,
    # but for the embedding's backward: its tables' dense gradients, weight-sized, kept per
    # micro-batch by the profile (schema 5)
    layers = [
        dataclasses.replace(x, fwd_tmp_bytes=100.0 + i, bwd_tmp_bytes=200.0 + i)
        for i, x in enumerate(profile.layers)
    ]
    traced = dataclasses.replace(profile, layers=tuple(layers))
    by_flops = chain_from_profile(traced, micro_batch_size=2, seconds_per_flop=1e-12)
    assert [x.fwd_tmp_bytes for x in by_flops.layers] == [2 * (100.0 + i) for i in range(14)]
    assert [x.bwd_tmp_bytes for x in by_flops.layers] == [200.0] + [
        2 * (200.0 + i) for i in range(1, 14)
    ]
    assert by_flops.layers[1].fwd_s == pytest.approx(2 * profile.layers[1].fwd_flops * 1e-12)
    # Measured: per-sequence times scale with the micro-batch; a head traced without its
    # input size (as the profiler leaves it) still chains onto the last block.
    layers = [
        dataclasses.replace(x, fwd_time_s=0.01 * (i + 1), bwd_time_s=0.02 * (i + 1))
        for i, x in enumerate(profile.layers)
    ]
    layers[-1] = dataclasses.replace(layers[-1], input_bytes=0.0)
    measured = dataclasses.replace(profile, layers=tuple(layers))
    chain = chain_from_profile(measured, micro_batch_size=3)
    assert [x.fwd_s for x in chain.layers] == pytest.approx([0.03 * (i + 1) for i in range(14)])
    assert [x.bwd_s for x in chain.layers] == pytest.approx([0.06 * (i + 1) for i in range(14)])
    assert chain.layers[-1].input_bytes == chain.layers[-2].output_bytes > 0
