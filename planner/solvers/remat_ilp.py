"""Rematerialization + offload on op graphs: an ILP in the style of Checkmate (Jain et al. 2020
§4) extended with offload/prefetch over a bandwidth-limited channel; model in `ilp_model`.

`solve_remat_ilp` returns the fastest schedule within a memory budget, with a status: OPTIMAL,
FEASIBLE (time limit hit; `gap` bounds how far from optimal), INFEASIBLE (with the smallest
budget that works, from the same model minimizing the peak instead of the time) or TIME_LIMIT
(nothing found, nothing proven). With offload it first solves without the channel, then asks
the offload model only for something faster than that (a cutoff), so offload never loses.
Backend and time limit: CBC, 10 s, chosen by `benchmarks/bench_solvers.py` on the GPT-2 block
graph (see docs/benchmarks.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from .chain import LayerChain
from .graph import OpGraph, TensorPart, chain_to_graph
from .ilp_model import Key, Model, structure
from .schedule import (
    Backward,
    Forward,
    Offload,
    Op,
    Prefetch,
    SolveStatus,
    Wait,
    overhead,
)

BACKENDS = ("cbc", "highs")
DEFAULT_BACKEND = "cbc"
"""Faster of the two on the GPT-2 block graph with offload (benchmarks/bench_solvers.py)."""
DEFAULT_TIME_LIMIT_S = 10.0
"""Wall-clock limit of a solve (the offload phase gets what the first phase left); past it the
best schedule found is returned as FEASIBLE."""
ILP_MAX_OPS = 64
"""Largest op graph (compute nodes) worth handing to the ILP: the model grows with the square of
the node count and CBC takes about 8 s to prove a loose budget optimal on a traced 37-operation
GPT-2 block, and more than 60 s at a tight one (development machine, 2 cores)."""
OFFLOAD_GAIN = 1e-4
"""With offload, the second solve looks only for schedules at least this much (relative)
faster than the recompute-only optimum; below that the latter counts as optimal."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RematSolution:
    """Result of `solve_remat_ilp`."""

    status: SolveStatus
    """OPTIMAL, FEASIBLE (time limit hit, see `gap`), INFEASIBLE, or TIME_LIMIT (nothing found
    and nothing proven in the time allowed)."""
    budget_bytes: float
    """The memory budget asked for."""
    ops: tuple[Op, ...]
    """The schedule (graph node indices); empty if infeasible."""
    makespan_s: float | None
    """Time of the schedule under the model (recomputations and transfer stalls included)."""
    peak_bytes: float | None
    """Peak memory of the schedule under the model."""
    min_budget_bytes: float | None
    """If infeasible: the smallest budget for which a schedule exists (None otherwise)."""
    gap: float | None
    """Relative distance to the best bound when FEASIBLE (an upper bound on it with CBC, which
    compares with the no-recomputation time); 0 when OPTIMAL; None when INFEASIBLE."""
    store_all_makespan_s: float
    """Time without recomputation or transfers (the overhead reference)."""
    backend: str
    """"cbc" or "highs"."""
    num_binaries: int
    """Binary variables in the model."""
    solve_s: float
    """Wall time of the solve (model building included)."""
    message: str
    """What happened, in words."""

    @property
    def overhead(self) -> float | None:
        """Makespan over the no-recomputation time, minus 1."""
        return overhead(self.makespan_s, self.store_all_makespan_s)


SOLVER_THREADS = 2
"""Threads for the MIP solver (the development machine has two cores)."""


def _solver(backend: str, time_limit_s: float, gap_rel: float, cutoff: float | None) -> Any:
    """A PuLP solver; `cutoff` prunes every solution not better than a known one (the start
    is given that way: CBC 2.10's MIP-start reader crashes on larger models)."""
    import warnings

    import pulp

    if backend == "cbc":
        with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC for PuLP 4
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=time_limit_s,
                gapRel=gap_rel,
                threads=SOLVER_THREADS,
                options=[] if cutoff is None else [f"cutoff {cutoff!r}"],
            )
    extra = {} if cutoff is None else {"objective_bound": cutoff}
    return pulp.HiGHS(
        msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=SOLVER_THREADS, **extra
    )


def _value(v: Any) -> float:
    return float(v) if isinstance(v, int | float) else float(round(v.varValue or 0.0))


def _solve(
    model: Model, backend: str, time_limit_s: float, gap_rel: float, cutoff: float | None = None
) -> tuple[bool, bool]:
    """(solution found, search complete); binaries are rounded so expressions evaluate
    exactly. With a cutoff, "complete" without a solution proves nothing beats the cutoff."""
    import pulp

    model.prob.solve(_solver(backend, max(time_limit_s, 0.1), gap_rel, cutoff))
    found = model.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if found:
        for var in model.prob.variables():
            if var.cat == pulp.LpBinary and var.varValue is not None:
                var.varValue = round(var.varValue)
    complete = (
        model.prob.sol_status == pulp.LpSolutionOptimal
        or model.prob.status == pulp.LpStatusInfeasible
    )
    return found, complete


def _share(v: Any) -> float:
    value = float(v.varValue or 0.0) if not isinstance(v, int | float) else float(v)
    return 0.0 if value < 1e-9 else min(value, 1.0)


def _schedule(model: Model) -> tuple[list[Op], float]:
    """The operations a solution describes and their makespan (what the simulator replays:
    transfer slices at stage start, compute back to back, a wait ending a stage that moved
    anything). Slices of a released offload or a completed prefetch are scaled to add up to
    exactly 1 (solver tolerances leave them ~1e-7 off)."""
    st, g = model.st, model.st.graph
    scale: dict[tuple[str, Key], float] = {}
    for kind, w, done in (("out", model.wo, model.Dn), ("in", model.wi, model.Ar)):
        for key in {k for (_, k) in w}:
            total = sum(_share(v) for (t, k), v in w.items() if k == key)
            finished = any(_value(v) for (t, k), v in done.items() if k == key)
            scale[kind, key] = 1.0 / total if finished and total > 0 else 1.0
    ops: list[Op] = []
    end = 0.0
    fetched: dict[Key, float] = {}
    for t in range(st.stages):
        moved = 0.0
        issued = False
        for key in st.keys:
            if _value(model.Rd.get((t, key), 0)):
                share = _share(model.wo[t, key]) * scale["out", key]
                ops.append(
                    Offload(
                        node=key[0],
                        part=TensorPart(key[1]),
                        fraction=share,
                        release=bool(_value(model.Dn[t, key])),
                    )
                )
                moved, issued = moved + share * st.size[key], True
            if _value(model.Pi.get((t, key), 0)) and fetched.get(key, 0.0) < 1 - 1e-9:
                # (an empty slice after the last one would start a new prefetch: left out)
                share = _share(model.wi[t, key]) * scale["in", key]
                fetched[key] = fetched.get(key, 0.0) + share
                ops.append(Prefetch(node=key[0], part=TensorPart(key[1]), fraction=share))
                moved, issued = moved + share * st.size[key], True
        compute = 0.0
        for i in model.ops(t):
            if _value(model.R[t, i]):
                ops.append(Forward(node=i, keep_saved=bool(_value(model.K.get((t, i), 0)))))
                compute += g.nodes[i].fwd_s
        b = st.bwd_node(t)
        if b is not None:
            ops.append(Backward(node=b))
            compute += g.nodes[b].bwd_s
        if issued:
            ops.append(Wait())
            compute = max(compute, moved / (model.bw or math.inf))
        end += compute
    return ops, end


def _peak(model: Model) -> float:
    return max(float(model.pulp.value(expr)) for expr in model.U) * model.mem_scale


def solve_remat_ilp(
    model: OpGraph | LayerChain,
    budget_bytes: float,
    *,
    pcie_bytes_per_s: float | None = None,
    backend: str = DEFAULT_BACKEND,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    gap_rel: float = 1e-6,
    persistent: bool = False,
) -> RematSolution:
    """Fastest schedule of `model` (a chain is solved as its path graph) whose peak memory stays
    within `budget_bytes`, recomputing and, with `pcie_bytes_per_s`, offloading tensors.

    `persistent` keeps every tensor that crosses a stage boundary until its last reader (or its
    offload): Rotor's schedule space (Beaumont et al. 2019 §3-4), so on a chain the ILP then
    finds the DP's optimum. Without it the ILP also drops a checkpoint after using it and
    recomputes it later, which can be faster on heterogeneous chains."""
    start = time.perf_counter()
    if (
        isinstance(budget_bytes, bool)
        or not isinstance(budget_bytes, int | float)
        or not (math.isfinite(budget_bytes) and budget_bytes >= 0)
    ):
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a finite number >= 0 (bytes)")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
    if pcie_bytes_per_s is not None and not (
        math.isfinite(pcie_bytes_per_s) and pcie_bytes_per_s > 0
    ):
        raise ValueError(
            f"pcie_bytes_per_s={pcie_bytes_per_s!r} must be a finite number > 0 (bytes/s), "
            "or None for no offload"
        )
    if not (time_limit_s > 0 and 0 <= gap_rel < 1):
        raise ValueError(
            f"time_limit_s={time_limit_s!r} must be > 0 and gap_rel={gap_rel!r} in [0, 1)"
        )
    graph = chain_to_graph(model) if isinstance(model, LayerChain) else model
    st = structure(graph)
    ref = graph.store_all_makespan_s
    ilp = Model(st, float(budget_bytes), None, persistent=persistent)
    found, optimal = _solve(ilp, backend, time_limit_s, gap_rel)
    if pcie_bytes_per_s is not None:
        # Offload: solve again with the channel, asking only for schedules that beat the
        # recompute-only one (whose objective is the same in both models: no transfers).
        off = Model(st, float(budget_bytes), pcie_bytes_per_s, persistent=persistent)
        cutoff = None
        if found:
            cutoff = float(ilp.pulp.value(ilp.prob.objective)) * (1 - OFFLOAD_GAIN)
        left = time_limit_s - (time.perf_counter() - start)
        off_found, off_complete = _solve(off, backend, left, max(gap_rel, OFFLOAD_GAIN), cutoff)
        if off_found and (not found or _schedule(off)[1] <= _schedule(ilp)[1]):
            ilp, found, optimal = off, True, off_complete
        elif found:  # nothing better: the recompute-only optimum stands if the search finished
            optimal = optimal and off_complete
        else:
            optimal = off_complete

    def result(status: SolveStatus, message: str, **kw: Any) -> RematSolution:
        fields: dict[str, Any] = dict(
            ops=(), makespan_s=None, peak_bytes=None, min_budget_bytes=None, gap=None
        )
        fields.update(kw)
        return RematSolution(
            status=status,
            budget_bytes=float(budget_bytes),
            store_all_makespan_s=ref,
            backend=backend,
            num_binaries=ilp.count,
            solve_s=time.perf_counter() - start,
            message=message,
            **fields,
        )

    if found:
        ops, makespan = _schedule(ilp)
        peak = _peak(ilp)
        over = makespan / ref - 1 if ref > 0 else 0.0
        if optimal:
            message = f"optimal: {over:.2%} over no recomputation"
            return result(
                SolveStatus.OPTIMAL,
                message,
                ops=tuple(ops),
                makespan_s=makespan,
                peak_bytes=peak,
                gap=0.0,
            )
        gap = _gap(ilp, makespan, ref)
        return result(
            SolveStatus.FEASIBLE,
            (
                f"time limit of {time_limit_s:g} s reached: {over:.2%} over no recomputation, "
                f"within {gap:.2%} of optimal"
            ),
            ops=tuple(ops),
            makespan_s=makespan,
            peak_bytes=peak,
            gap=gap,
        )
    # Nothing within the budget: proven (the search finished) or the time ran out.
    proven = optimal
    least = Model(structure(graph), None, pcie_bytes_per_s, persistent=persistent)
    found, exact = _solve(least, backend, time_limit_s, gap_rel)
    if found and _peak(least) <= budget_bytes * (1 + 1e-9):
        ops, makespan = _schedule(least)
        gap = max(0.0, (makespan - ref) / makespan) if makespan > 0 else 0.0
        return result(
            SolveStatus.FEASIBLE,
            (
                f"time limit of {time_limit_s:g} s reached before any fast schedule was found; "
                "this one minimizes memory, not time: raise time_limit_s"
            ),
            ops=tuple(ops),
            makespan_s=makespan,
            peak_bytes=_peak(least),
            gap=gap,
        )
    if not found or not (proven or exact):
        return result(
            SolveStatus.TIME_LIMIT,
            (
                f"no schedule found within {budget_bytes:.6g} bytes in {time_limit_s:g} s, and no "
                "proof that none exists; raise time_limit_s"
            ),
        )
    need = _peak(least)
    return result(
        SolveStatus.INFEASIBLE,
        (
            f"no schedule of {graph.name!r} fits in {budget_bytes:.6g} bytes: the smallest peak "
            f"any schedule reaches is {need:.6g} bytes{'' if exact else ' (or less)'}; raise the "
            "budget to at least that" + ("" if pcie_bytes_per_s else ", or allow offload")
        ),
        min_budget_bytes=need,
    )


def min_peak_remat_ilp(
    model: OpGraph | LayerChain,
    *,
    backend: str = DEFAULT_BACKEND,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> tuple[float | None, bool]:
    """The smallest peak any schedule of `model` reaches (recomputation only, no offload),
    from the ILP minimizing the peak instead of the time: (peak, proven). The peak is None
    when nothing was found within `time_limit_s`; unproven, it is an upper bound."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
    graph = chain_to_graph(model) if isinstance(model, LayerChain) else model
    least = Model(structure(graph), None, None)
    found, exact = _solve(least, backend, time_limit_s, 1e-6)
    return (_peak(least) if found else None), exact


def _gap(model: Model, makespan: float, ref: float) -> float:
    bound = ref
    info = getattr(model.prob, "solverModel", None)
    if info is not None and hasattr(info, "getInfo"):  # HiGHS reports its best bound
        bound = max(bound, float(info.getInfo().mip_dual_bound) * model.time_scale)
    return max(0.0, (makespan - bound) / makespan) if makespan > 0 else 0.0
