"""Optimal checkpointing of a chain: Rotor's dynamic program (Beaumont et al. 2019, "Optimal
checkpointing for heterogeneous chains: how to train deep neural networks with limited memory",
§4, the recurrence for C_BP), with memory discretized into units.

The schedule space (Rotor's "persistent" schedules). A segment s..t of layers starts with its
input x_{s-1} on the device (and the gradient of its output, except for the chain's last layer,
whose seed appears at the first backward) and either
- stores all (F_all): runs layer s keeping what its backward reads, solves s+1..t, runs B_s; or
- checkpoints: runs layers s..s'-1 keeping nothing but x_{s-1}, solves s'..t from x_{s'-1}, then
  solves s..s'-1 again from x_{s-1} (recomputing it).
A single layer runs F_all then B. `Opt(s, t, m)` is the least time of a segment whose memory,
x_{s-1} included, never exceeds m; the DP tabulates it for every m in units (sizes are rounded
up, so a schedule that fits in units fits in bytes) and reads the schedule back.

Speed: O(L^3 M) additions, vectorized with numpy over the memory axis and the split point s';
segments are visited in blocks of starts so the tables stay in cache (measured in
benchmarks/bench_solvers.py). The exact smallest peak over the same space is a separate
O(L^3) min-max DP in bytes, which gives the infeasible status its smallest budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from .chain import LayerChain
from .schedule import Backward, Forward, Op, SolveStatus, overhead

Tree = tuple[Any, ...]
"""(0, s) leaf | (1, s, t, child) store all | (2, s, t, s', child_right, child_left)."""

_FLOAT32_CELLS = 4_000_000
"""Above this many table cells the DP keeps its tables in float32 (half the memory traffic);
the chosen schedule's time is recomputed exactly, so only near-ties can be resolved ~1e-7 off."""
_REFINE = 8
"""Factor by which the units shrink when the budget is too tight for the first ones."""
_REFINE_CELLS = 20_000_000
"""Largest table (cells) such a retry may build."""
_BLOCK = 8
"""Segment starts per block (keeps the rows a block reads in the 2 MiB L2 cache)."""
_EPS = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class ChainSolution:
    """Result of `solve_checkpoint_dp`."""

    status: SolveStatus
    """OPTIMAL (for the discretized problem), FEASIBLE (discretization too coarse to prove it;
    the best of the min-peak and uniform schedules is returned) or INFEASIBLE."""
    budget_bytes: float
    """The memory budget asked for."""
    ops: tuple[Op, ...]
    """The schedule on `chain_to_graph(chain)` (node l is layer l-1); empty if infeasible."""
    makespan_s: float | None
    """Time of the schedule (forward, recomputations, backward); None if infeasible."""
    peak_bytes: float | None
    """Peak memory of the schedule; None if infeasible."""
    min_budget_bytes: float
    """Smallest budget for which any schedule of the DP's space fits (exact, in bytes)."""
    store_all_makespan_s: float
    """Time without recomputation (the overhead reference)."""
    unit_bytes: float
    """Size of one memory unit of the discretization."""
    message: str
    """What happened, in words."""
    solve_s: float
    """Wall time of the solve."""

    @property
    def overhead(self) -> float | None:
        """Makespan over the no-recomputation time, minus 1."""
        return overhead(self.makespan_s, self.store_all_makespan_s)


class _Sizes:
    """Per-layer figures, 1-based (index 0 of x is the chain input), as Python lists."""

    def __init__(self, chain: LayerChain, unit: float | None) -> None:
        def q(v: float) -> float:
            return v if unit is None else math.ceil(v / unit - _EPS)

        layers = chain.layers
        self.L = len(layers)
        self.x = [q(chain.input_bytes)] + [q(ly.output_bytes) for ly in layers]
        self.a = [0.0] + [q(ly.extra_saved_bytes) for ly in layers]
        self.tf = [0.0] + [q(ly.fwd_tmp_bytes) for ly in layers]
        self.tb = [0.0] + [q(ly.bwd_tmp_bytes) for ly in layers]
        self.df = [*self.x[:-1], 0.0]  # gradient of x_t held during a forward phase
        self.F = [0.0] + [ly.fwd_s for ly in layers]
        self.FB = [0.0] + [ly.fwd_s + ly.bwd_s for ly in layers]
        self.Fc = [0.0]
        for f in self.F[1:]:
            self.Fc.append(self.Fc[-1] + f)

    def need_leaf(self, s: int) -> float:
        x, a = self.x, self.a
        return max(
            x[s - 1] + self.df[s] + x[s] + a[s] + self.tf[s],
            x[s - 1] + x[s] + a[s] + x[s - 1] + self.tb[s],
        )

    def need_sa(self, s: int, t: int) -> float:
        x, a = self.x, self.a
        return max(
            x[s - 1] + self.df[t] + x[s] + a[s] + self.tf[s],
            x[s - 1] + a[s] + x[s] + x[s - 1] + self.tb[s],
        )

    def run_peak(self, s: int, sp: int, t: int) -> float:
        """Peak of running layers s..sp-1 keeping only x_{s-1} (and the gradient of x_t)."""
        x = self.x
        return max(
            x[s - 1] + self.df[t] + (x[k - 1] if k > s else 0.0) + x[k] + self.tf[k]
            for k in range(s, sp)
        )


# ---- exact evaluation and emission of a schedule tree ----------------------------------------
def tree_cost(tree: Tree, sz: _Sizes) -> tuple[float, float]:
    """(time, peak) of a tree in the units of `sz` (bytes when built without a unit)."""
    kind, s = tree[0], tree[1]
    x, a = sz.x, sz.a
    if kind == 0:
        return sz.FB[s], sz.need_leaf(s)
    t = tree[2]
    if kind == 1:
        time_s, peak = tree_cost(tree[3], sz)
        return sz.FB[s] + time_s, max(sz.need_sa(s, t), x[s - 1] + a[s] + peak)
    sp = tree[3]
    t1, p1 = tree_cost(tree[4], sz)
    t2, p2 = tree_cost(tree[5], sz)
    run = sz.run_peak(s, sp, t)
    return sz.Fc[sp - 1] - sz.Fc[s - 1] + t1 + t2, max(run, x[s - 1] + p1, p2)


def tree_ops(tree: Tree) -> list[Op]:
    """The schedule of a tree (node l of `chain_to_graph` is layer l-1, i.e. 1-based here)."""
    kind, s = tree[0], tree[1]
    if kind == 0:
        return [Forward(node=s, keep_saved=True), Backward(node=s)]
    if kind == 1:
        return [Forward(node=s, keep_saved=True), *tree_ops(tree[3]), Backward(node=s)]
    run: list[Op] = [Forward(node=k, keep_saved=False) for k in range(s, tree[3])]
    return run + tree_ops(tree[4]) + tree_ops(tree[5])


def store_all_tree(s: int, t: int) -> Tree:
    """Keep everything: no recomputation."""
    tree: Tree = (0, t)
    for k in range(t - 1, s - 1, -1):
        tree = (1, k, t, tree)
    return tree


def segments_tree(starts: list[int], L: int) -> Tree:
    """Checkpoint at each start of `starts` (1-based, first = 1); store all inside segments.
    ``starts=[1..L]`` is full recomputation; `checkpoint_sequential` uses √L segments."""
    tree = store_all_tree(starts[-1], L)
    for i in range(len(starts) - 2, -1, -1):
        s, sp = starts[i], starts[i + 1]
        tree = (2, s, L, sp, tree, store_all_tree(s, sp - 1))
    return tree


# ---- exact smallest peak (min-max DP in bytes) ---------------------------------------------
def _min_peak(sz: _Sizes) -> tuple[float, Tree]:
    import numpy as np

    L = sz.L
    x, a, df = np.array(sz.x), np.array(sz.a), np.array(sz.df)
    mp = np.full((L + 2, L + 2), np.inf)
    choice = np.zeros((L + 2, L + 2), dtype=np.int64)
    # g[s, s'] = max_{k=s}^{s'-1} ([k>s] x[k-1] + x[k] + tf[k]): the run's own part of its peak
    h = np.zeros(L + 2)
    h[1 : L + 1] = x[:-1] + x[1:] + np.array(sz.tf[1:])
    g = np.zeros((L + 2, L + 2))
    for s in range(1, L + 1):
        first = x[s] + sz.tf[s]
        g[s, s + 1 : L + 2] = np.maximum.accumulate(np.concatenate([[first], h[s + 1 : L + 1]]))
    for s in range(1, L + 1):
        mp[s, s] = sz.need_leaf(s)
    for d in range(1, L):
        S = np.arange(1, L - d + 1)
        T = S + d
        need = np.array([sz.need_sa(s, s + d) for s in S.tolist()])
        sa = np.maximum(need, x[S - 1] + a[S] + mp[S + 1, T])
        J = np.arange(1, d + 1)[None, :]
        Sc, Tc, Xc = S[:, None], T[:, None], x[S - 1][:, None]
        ck = np.maximum(
            np.maximum(Xc + mp[Sc + J, Tc], mp[Sc, Sc + J - 1]), Xc + df[Tc] + g[Sc, Sc + J]
        )
        best = ck.argmin(axis=1)
        ckmin = ck[np.arange(len(S)), best]
        mp[S, T] = np.minimum(sa, ckmin)
        choice[S, T] = np.where(ckmin < sa, best + 1, 0)

    def build(s: int, t: int) -> Tree:
        if s == t:
            return (0, s)
        j = int(choice[s, t])
        if j == 0:
            return (1, s, t, build(s + 1, t))
        return (2, s, t, s + j, build(s + j, t), build(s, s + j - 1))

    return float(mp[1, L]), build(1, L)


def sqrt_segment_starts(num_layers: int, segments: int | None = None) -> list[int]:
    """1-based first layers of `torch.utils.checkpoint.checkpoint_sequential`'s segments: the
    first `segments - 1` have `num_layers // segments` layers, the last the rest; by default
    round(√L) segments (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", §4)."""
    k = segments if segments is not None else max(1, round(math.sqrt(num_layers)))
    if not 1 <= k <= num_layers:
        raise ValueError(f"segments={k!r} must be between 1 and the {num_layers} layers")
    size = num_layers // k
    return [1 + i * size for i in range(k)]


# ---- the time DP (discretized) --------------------------------------------------------------
def _run_maxima(sz: _Sizes) -> list[list[float]]:
    """g[s][j-1] = max_{k=s}^{s+j-1} ([k>s] x[k-1] + x[k] + tf[k]), for j = 1..L-s+1."""
    x, tf = sz.x, sz.tf
    g: list[list[float]] = [[]]
    for s in range(1, sz.L + 1):
        cur = x[s] + tf[s]
        row = [cur]
        for k in range(s + 1, sz.L + 1):
            cur = max(cur, x[k - 1] + x[k] + tf[k])
            row.append(cur)
        g.append(row)
    return g


def _time_tables(sz: _Sizes, g: list[list[float]], M: int) -> list[Any]:
    """tab[s][t-s, m] = Opt(s, t, m) for memory m = 0..M units (inf: nothing fits)."""
    import numpy as np

    L, W = sz.L, M + 1
    dtype = np.float32 if L * L * W / 2 > _FLOAT32_CELLS else np.float64
    x, a, df, FB, Fc = sz.x, sz.a, sz.df, sz.FB, sz.Fc
    inf = np.inf
    tab: list[Any] = [None] * (L + 2)
    flat: list[Any] = [None] * (L + 2)
    sat: list[list[int]] = [[] for _ in range(L + 2)]  # memory from which nothing is recomputed
    # ends[t][s'-1] = Opt(s', t) + Fc[s'-1]; one spare row so shifted flat reads stay inside
    ends = [np.full((t + 1, W), inf, dtype) for t in range(L + 1)]
    ends_flat = [e.ravel() for e in ends]
    buf = np.empty(L * W, dtype)
    cols = np.arange(W)
    # Row r of a checkpoint candidate (s' = s+r+1) is valid from m = x_{s-1} + df[t] + g[s][r]:
    # past the first valid column t0 = ... + g[s][0], the invalid cells are late[s][r, m - t0]
    # (independent of t).
    late: list[Any] = [None] * (L + 2)
    for s in range(1, L + 1):
        steps = np.asarray(g[s]) - g[s][0]
        late[s] = cols[None, : min(int(steps[-1]), W)] < steps[:, None]
    for s1 in range(L, 0, -_BLOCK):
        s0 = max(1, s1 - _BLOCK + 1)
        for s in range(s0, s1 + 1):
            tab[s] = np.full((L - s + 2, W), inf, dtype)
            flat[s] = tab[s].ravel()
            sat[s] = [0] * (L - s + 1)
        for t in range(s0, L + 1):
            for s in range(min(t, s1), s0 - 1, -1):
                row, xs = tab[s][t - s], int(x[s - 1])
                if s == t:
                    need = int(sz.need_leaf(s))
                    sat[s][0] = need
                    if need <= M:
                        row[need:] = FB[s]
                    np.add(row, Fc[s - 1], out=ends[t][s - 1])
                    continue
                # store all: F_all s, then s+1..t with x_{s-1} and layer s's saved tensor held
                need, shift, n = int(sz.need_sa(s, t)), xs + int(a[s]), t - s
                sat[s][n] = hi = max(need, shift + sat[s + 1][n - 1])
                lo = max(need, shift)
                if lo <= M:
                    np.add(tab[s + 1][n - 1][lo - shift : W - shift], FB[s], out=row[lo:])
                # checkpoint: rows r = s'-s-1 for s' = s+1..t; valid where m >= run peak
                base = xs + int(df[t])
                t0, t1, hi = base + int(g[s][0]), base + int(g[s][n - 1]), min(hi, W)
                if t0 < hi:
                    width = hi - t0
                    if 3 * width < W:
                        c = buf[: n * width].reshape(n, width)
                        np.add(ends[t][s:t, t0 - xs : hi - xs], tab[s][:n, t0:hi], out=c)
                    else:  # whole rows as one flat add (columns past `width` are ignored)
                        start = s * W + t0 - xs
                        np.add(
                            ends_flat[t][start : start + n * W],
                            flat[s][t0 : t0 + n * W],
                            out=buf[: n * W],
                        )
                        c = buf[: n * W].reshape(n, W)
                    if t1 > t0:
                        band = min(t1, hi) - t0
                        c[:, :band][late[s][:n, :band]] = inf
                    ck = c.min(axis=0)[:width]
                    ck -= Fc[s - 1]
                    np.minimum(row[t0:hi], ck, out=row[t0:hi])
                np.add(row, Fc[s - 1], out=ends[t][s - 1])
    return tab


def _read_back(tab: list[Any], sz: _Sizes, g: list[list[float]], s: int, t: int, m: int) -> Tree:
    """The schedule tree achieving tab[s][t-s, m] (the first best choice, store-all first)."""
    if s == t:
        return (0, s)
    x, a, n = sz.x, sz.a, t - s
    xs, shift = int(x[s - 1]), int(x[s - 1] + a[s])
    best, choice = math.inf, 0
    if m >= sz.need_sa(s, t) and m >= shift:
        best = sz.FB[s] + float(tab[s + 1][n - 1][m - shift])
    base = xs + sz.df[t]
    for j in range(1, n + 1):
        if m < base + g[s][j - 1] or m < xs:
            break  # run peaks only grow with j
        value = (
            float(tab[s + j][n - j][m - xs])
            + sz.Fc[s + j - 1]
            + float(tab[s][j - 1][m])
            - sz.Fc[s - 1]
        )
        if value < best:
            best, choice = value, j
    if best == math.inf:
        raise RuntimeError(f"DP read-back found no choice for segment {s}..{t} at m={m}")
    if choice == 0:
        return (1, s, t, _read_back(tab, sz, g, s + 1, t, m - shift))
    sp = s + choice
    right = _read_back(tab, sz, g, sp, t, m - xs)
    return (2, s, t, sp, right, _read_back(tab, sz, g, s, sp - 1, m))


def solve_checkpoint_dp(
    chain: LayerChain, budget_bytes: float, *, num_units: int = 500, unit_bytes: float | None = None
) -> ChainSolution:
    """Fastest schedule of `chain` whose peak memory stays within `budget_bytes`.

    Memory is discretized into `num_units` units of ``budget_bytes / num_units`` (or units of
    `unit_bytes`); sizes are rounded up, so the schedule always fits in bytes, and it is optimal
    among the schedules that fit once rounded (exactly optimal when every size is a multiple of
    the unit). The result is never slower than store-all, full recomputation, √L segments or the
    min-peak schedule when those fit the budget in bytes (rounding can hide one from the DP).
    """
    start = time.perf_counter()
    if (
        isinstance(budget_bytes, bool)
        or not isinstance(budget_bytes, int | float)
        or not (math.isfinite(budget_bytes) and budget_bytes >= 0)
    ):
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a finite number >= 0 (bytes)")
    if unit_bytes is None and (not isinstance(num_units, int) or not 1 <= num_units <= 100_000):
        raise ValueError(f"num_units={num_units!r} must be an integer in 1..100000; e.g. 500")
    if unit_bytes is not None and not (math.isfinite(unit_bytes) and unit_bytes > 0):
        raise ValueError(f"unit_bytes={unit_bytes!r} must be a finite number > 0 (bytes)")
    exact, L = _Sizes(chain, None), len(chain)
    min_peak, min_tree = _min_peak(exact)
    ref = chain.store_all_makespan_s

    def done(status: SolveStatus, tree: Tree | None, unit: float, message: str) -> ChainSolution:
        cost = tree_cost(tree, exact) if tree is not None else (None, None)
        return ChainSolution(
            status=status,
            budget_bytes=float(budget_bytes),
            ops=tuple(tree_ops(tree)) if tree is not None else (),
            makespan_s=cost[0],
            peak_bytes=cost[1],
            min_budget_bytes=min_peak,
            store_all_makespan_s=ref,
            unit_bytes=unit,
            message=message,
            solve_s=time.perf_counter() - start,
        )

    if min_peak > budget_bytes * (1 + _EPS):
        return done(
            SolveStatus.INFEASIBLE,
            None,
            0.0,
            (
                f"no checkpointing schedule of {chain.name!r} fits in {budget_bytes:.6g} bytes: "
                f"the smallest peak any schedule reaches is {min_peak:.6g} bytes; raise the budget "
                "to at least that, or offload or shard activations"
            ),
        )
    everything = store_all_tree(1, L)
    if tree_cost(everything, exact)[1] <= budget_bytes * (1 + _EPS):
        return done(
            SolveStatus.OPTIMAL,
            everything,
            0.0,
            "everything fits: store all activations, no recomputation",
        )
    unit = unit_bytes if unit_bytes is not None else budget_bytes / num_units
    M = math.floor(budget_bytes / unit + _EPS)
    if M > 1_000_000:
        raise ValueError(
            f"unit_bytes={unit_bytes!r} makes {M} memory units; use a unit of at least "
            f"{budget_bytes / 1_000_000:.6g} bytes (or num_units)"
        )
    while True:
        units = _Sizes(chain, unit)
        g = _run_maxima(units)
        tab = _time_tables(units, g, M)
        found = bool(tab[1][L - 1][M] < math.inf)
        # Near the smallest budget, rounding sizes up can leave nothing: retry with finer
        # units while the tables stay small.
        if found or unit_bytes is not None or L * L * (M * _REFINE + 1) / 2 > _REFINE_CELLS:
            break
        unit, M = unit / _REFINE, M * _REFINE
    candidates = [_read_back(tab, units, g, 1, L, M)] if found else []
    candidates += [
        min_tree,
        segments_tree(list(range(1, L + 1)), L),
        segments_tree(sqrt_segment_starts(L), L),
    ]
    costs = [tree_cost(tree, exact) for tree in candidates]
    fits = [i for i, (_, peak) in enumerate(costs) if peak <= budget_bytes * (1 + _EPS)]
    best = min(fits, key=lambda i: (costs[i][0], i))
    overhead = costs[best][0] / ref - 1 if ref > 0 else 0.0
    if found:
        return done(
            SolveStatus.OPTIMAL,
            candidates[best],
            unit,
            (
                f"optimal for memory in units of {unit:.6g} bytes: {overhead:.2%} over no "
                "recomputation"
            ),
        )
    return done(
        SolveStatus.FEASIBLE,
        candidates[best],
        unit,
        (
            f"with sizes rounded up to {unit:.6g}-byte units nothing fits, so the best of the "
            f"min-peak and uniform schedules is returned ({overhead:.2%} over no recomputation); "
            "pass a larger num_units to search the whole space"
        ),
    )
