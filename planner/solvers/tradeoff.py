"""Time-vs-memory trade-off curves: for each memory budget, the makespan of every checkpointing
strategy that fits, relative to storing everything.

Strategies (`STRATEGIES`):

- ``store-all``: no recomputation (what plain autograd does).
- ``sqrt-L``: `torch.utils.checkpoint.checkpoint_sequential(layers, round(√L))`: the first
  segments of ``L // segments`` layers keep only their input and are recomputed before their
  backward, the last segment (the rest) runs normally (Chen et al. 2016, "Training Deep Nets
  with Sublinear Memory Cost", §4).
- ``full-recompute``: `torch.utils.checkpoint.checkpoint` around every layer but the last.
- ``paraplan-dp``: Rotor's optimal persistent schedule at the budget (Beaumont et al. 2019,
  "Optimal checkpointing for heterogeneous chains", `solve_checkpoint_dp`).
- ``paraplan-ilp``: the Checkmate-style ILP on the chain's path graph, with offload when a
  PCIe bandwidth is given (Jain et al. 2020, "Checkmate", `solve_remat_ilp`).

The three baselines are fixed schedules: their peak does not depend on the budget, so a
baseline point is feasible exactly when its simulated peak fits. Every point's makespan and
peak are the simulator's replay of the schedule (a solver's own claims are checked against it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .chain import LayerChain
from .checkpoint_dp import ChainSolution, solve_checkpoint_dp
from .policies import Policy, uniform_schedule
from .remat_ilp import DEFAULT_TIME_LIMIT_S, RematSolution, solve_remat_ilp
from .schedule import Op, SolveStatus
from .simulator import SimResult, simulate

STRATEGIES = ("store-all", "sqrt-L", "full-recompute", "paraplan-dp", "paraplan-ilp")
"""Every strategy `tradeoff_curves` knows, baselines first."""
BASELINES: dict[str, Policy] = {
    "store-all": Policy.STORE_ALL,
    "sqrt-L": Policy.SQRT_SEGMENTS,
    "full-recompute": Policy.FULL_RECOMPUTE,
}
"""The fixed-schedule strategies and the uniform policy each one is."""
BUDGET_REL_TOL = 1e-9
"""A peak fits a budget up to this relative slack (the solvers' own tolerance)."""
CLAIM_REL_TOL = 1e-6
"""A solver's claimed makespan and peak must match the simulator's to this relative error."""
LOW_MARGIN = 0.01
"""`default_budgets` starts this much (relative) above the smallest feasible peak: at the
minimum itself only the min-peak schedules fit, and the DP, whose memory is discretized, can
only return the min-peak one, however slow (benchmarks/bench_solvers.py does the same)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TradeoffPoint:
    """One strategy at one memory budget."""

    budget_bytes: float
    """The memory budget."""
    status: str
    """`SolveStatus` value: "optimal" (a baseline that fits, or a proven optimum), "feasible"
    (fits, optimality not proven), "infeasible", or "time_limit" (the ILP found nothing in its
    time limit and proved nothing)."""
    makespan_s: float | None
    """Simulated time of the schedule (forward, recomputations, transfer stalls, backward);
    None when there is no schedule."""
    peak_bytes: float | None
    """Simulated peak memory of the schedule; None when there is no schedule."""
    overhead: float | None
    """``makespan_s / store-all makespan - 1``; None when there is no schedule."""
    min_budget_bytes: float | None = None
    """For an infeasible point, the smallest budget at which this strategy has a schedule (a
    baseline's simulated peak, the solver's reported minimum); None otherwise or unknown."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TradeoffCurve:
    """One strategy over a list of budgets."""

    strategy: str
    """One of `STRATEGIES`."""
    points: tuple[TradeoffPoint, ...]
    """One point per budget, in the order the budgets were given."""


def baseline_schedule(chain: LayerChain, strategy: str) -> list[Op]:
    """The fixed schedule of a baseline strategy ("store-all", "sqrt-L", "full-recompute")."""
    if strategy not in BASELINES:
        raise ValueError(f"strategy={strategy!r} is not a baseline; use one of {tuple(BASELINES)}")
    return uniform_schedule(chain, BASELINES[strategy])


def default_budgets(
    chain: LayerChain, n: int = 8, *, low_margin: float = LOW_MARGIN
) -> list[float]:
    """`n` evenly spaced budgets from the smallest feasible one up to the store-all peak: the
    first is `low_margin` (relative) above the smallest peak any checkpointing schedule
    reaches (the DP's exact minimum; see `LOW_MARGIN`), the last the store-all peak."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be an integer >= 1 (the number of budgets), e.g. 8")
    if not (isinstance(low_margin, int | float) and 0 <= low_margin < 1):
        raise ValueError(f"low_margin={low_margin!r} must be in [0, 1), e.g. 0.01")
    top = simulate(chain, baseline_schedule(chain, "store-all")).peak_bytes
    least = min(solve_checkpoint_dp(chain, 0.0).min_budget_bytes * (1 + low_margin), top)
    if n == 1 or least >= top:
        return [top]
    return [least + (top - least) * k / (n - 1) for k in range(n)]


def _fits(peak_bytes: float, budget_bytes: float) -> bool:
    return peak_bytes <= budget_bytes * (1 + BUDGET_REL_TOL)


def _overhead(makespan_s: float, ref_s: float) -> float:
    return makespan_s / ref_s - 1.0 if ref_s > 0 else 0.0


def _check_claim(
    strategy: str, budget: float, claimed: tuple[float, float], sim: SimResult
) -> None:
    """Raise RuntimeError if a solver's (makespan, peak) disagrees with its replay."""
    for what, mine, replayed in (
        ("makespan_s", claimed[0], sim.makespan_s),
        ("peak_bytes", claimed[1], sim.peak_bytes),
    ):
        if abs(mine - replayed) > CLAIM_REL_TOL * max(abs(replayed), 1.0):
            raise RuntimeError(
                f"{strategy} at budget {budget:.6g} bytes claims {what}={mine:.9g} but the "
                f"simulator replays {replayed:.9g}; this is a solver bug, please report it"
            )
    if not _fits(sim.peak_bytes, budget):
        raise RuntimeError(
            f"{strategy} at budget {budget:.6g} bytes returned a schedule peaking at "
            f"{sim.peak_bytes:.9g} bytes in the simulator; this is a solver bug, please report it"
        )


def tradeoff_curves(
    chain: LayerChain,
    budgets_bytes: Sequence[float],
    *,
    strategies: Sequence[str] = STRATEGIES,
    pcie_bytes_per_s: float | None = None,
    ilp_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    num_units: int = 500,
) -> tuple[TradeoffCurve, ...]:
    """One curve per strategy (in the order of `strategies`), one point per budget.

    Baselines are simulated once and are feasible where their peak fits; ``paraplan-dp`` runs
    `solve_checkpoint_dp` (`num_units` memory units) and ``paraplan-ilp`` `solve_remat_ilp`
    (offload over `pcie_bytes_per_s` if given, `ilp_time_limit_s` per budget) at each budget.
    Raises ValueError on bad arguments, RuntimeError if a solver's claim disagrees with the
    simulator.
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if isinstance(strategies, str) or unknown or not strategies:
        raise ValueError(
            f"strategies={strategies!r}: give a non-empty sequence of names from {STRATEGIES}"
            + (f" ({unknown} unknown)" if unknown and not isinstance(strategies, str) else "")
        )
    budgets = list(budgets_bytes)
    for b in budgets:
        if (
            isinstance(b, bool)
            or not isinstance(b, int | float)
            or not (math.isfinite(b) and b >= 0)
        ):
            raise ValueError(f"budget {b!r} must be a finite number of bytes >= 0")
    if not budgets:
        raise ValueError("budgets_bytes is empty; pass at least one budget (default_budgets)")
    ref_s = simulate(chain, baseline_schedule(chain, "store-all")).makespan_s
    curves = []
    for strategy in strategies:
        if strategy in BASELINES:
            sim = simulate(chain, baseline_schedule(chain, strategy))
            points = [_baseline_point(b, sim, ref_s) for b in budgets]
        else:
            points = [
                _solver_point(
                    chain, strategy, b, ref_s, pcie_bytes_per_s, ilp_time_limit_s, num_units
                )
                for b in budgets
            ]
        curves.append(TradeoffCurve(strategy=strategy, points=tuple(points)))
    return tuple(curves)


def _baseline_point(budget: float, sim: SimResult, ref_s: float) -> TradeoffPoint:
    if not _fits(sim.peak_bytes, budget):
        return TradeoffPoint(
            budget_bytes=float(budget),
            status=SolveStatus.INFEASIBLE.value,
            makespan_s=None,
            peak_bytes=None,
            overhead=None,
            min_budget_bytes=sim.peak_bytes,
        )
    return TradeoffPoint(
        budget_bytes=float(budget),
        status=SolveStatus.OPTIMAL.value,
        makespan_s=sim.makespan_s,
        peak_bytes=sim.peak_bytes,
        overhead=_overhead(sim.makespan_s, ref_s),
    )


def _solver_point(
    chain: LayerChain,
    strategy: str,
    budget: float,
    ref_s: float,
    pcie: float | None,
    time_limit_s: float,
    num_units: int,
) -> TradeoffPoint:
    sol: ChainSolution | RematSolution
    if strategy == "paraplan-dp":
        sol = solve_checkpoint_dp(chain, budget, num_units=num_units)
    else:
        sol = solve_remat_ilp(chain, budget, pcie_bytes_per_s=pcie, time_limit_s=time_limit_s)
    if not sol.ops or sol.makespan_s is None or sol.peak_bytes is None:
        return TradeoffPoint(
            budget_bytes=float(budget),
            status=SolveStatus(sol.status).value,
            makespan_s=None,
            peak_bytes=None,
            overhead=None,
            min_budget_bytes=sol.min_budget_bytes,
        )
    sim = simulate(chain, sol.ops, pcie_bytes_per_s=pcie)
    _check_claim(strategy, budget, (sol.makespan_s, sol.peak_bytes), sim)
    return TradeoffPoint(
        budget_bytes=float(budget),
        status=SolveStatus(sol.status).value,
        makespan_s=sim.makespan_s,
        peak_bytes=sim.peak_bytes,
        overhead=_overhead(sim.makespan_s, ref_s),
    )
