"""Per-layer recomputation for one pipeline stage: the least recompute time that fits.

Each block of a stage keeps all its activations (`none`), drops the attention core
(`selective`, Korthikanti et al. 2022 §5) or keeps only its input and re-runs its forward in
backward (`full`, Chen et al. 2016). With `f` micro-batches in flight (the pipeline schedule's
count, `in_flight_microbatches`) the stage holds, per sequence,

    f * sum_i kept_i(choice_i) + transient,
    transient = max(0, T0, max_{i: full} back_i - H)

where T0 is the largest profiled forward/backward transient of the stage's layers, back_i what
re-materializing block i adds back, and H the head's activations, freed before any block's
backward (the evaluator's `_act_sums` uses the same expression for uniform policies). The
solver minimizes the added forward time (the sum of the chosen layers' recompute seconds) under
a byte budget for that expression: a multiple-choice knapsack.

Exactness: the transient depends only on the largest `back_i` among the `full` layers, so each
distinct value is tried as a cap (layers above it may not choose `full`). Under a cap, stages
whose blocks are identical (every transformer stage) are solved exactly in closed form over the
counts of `full` and `selective` blocks (with up to `MAX_OUTLIERS` unlike blocks enumerated
around it); other heterogeneous stages by a dynamic program over the
bytes to free, discretized into `MAX_UNITS` units with each layer's savings rounded down (so a
schedule it returns always fits; it can miss the optimum by less than one unit per layer).
`tests/test_recompute_solver.py` checks both against brute force.

Pure Python (numpy only for heterogeneous stages); no torch.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..strategy import Recompute

MAX_UNITS = 4096
"""Units the bytes to free are discretized into on heterogeneous stages."""
MAX_OUTLIERS = 3
"""Blocks unlike the stage's most common block that are enumerated (3^k assignments) around the
closed form, as the first block of a traced model (it holds the rotary cache or mask); more
go to the dynamic program."""
POLICIES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
_REL = 1e-12
"""Relative slack for float comparisons against the budget."""
_LP_MARGIN = 1e-6
"""Relative margin on `least_recompute_s`: the closed form accepts a shortfall of 1e-9 of a
block's saving (`_identical`), and the sums run in another order."""


@dataclass(frozen=True, slots=True)
class LayerChoice:
    """A block's options: bytes kept per sequence and seconds of recompute per micro-batch."""

    none_bytes: float
    """Kept with no recompute."""
    selective_bytes: float
    """Kept with selective recompute (the attention core dropped)."""
    full_bytes: float
    """Kept with full recompute (the input only)."""
    selective_s: float
    """Recompute seconds per micro-batch under selective recompute."""
    full_s: float
    """Recompute seconds per micro-batch under full recompute (the block's forward)."""
    back_bytes: float
    """Transient bytes per sequence that re-materializing the block adds (full only)."""


@dataclass(frozen=True, slots=True)
class StageProblem:
    """One stage's activation budget and layers."""

    choices: tuple[LayerChoice | None, ...]
    """Per layer of the stage: its options, or None for a layer that never recomputes."""
    fixed_bytes: float
    """Kept bytes per sequence of the layers that never recompute, per micro-batch in flight
    (the head's scaled to the micro-batches the stage holds it for: `memory.head_in_flight`)."""
    inflight: float
    """Micro-batches whose activations the stage holds at its peak."""
    transient_bytes: float
    """T0: the largest profiled transient of the stage's layers, per sequence."""
    head_bytes: float
    """H: the head's kept bytes per sequence when the stage holds the head (else 0)."""
    budget_bytes: float
    """Bytes per sequence available to activations (capacity less static memory and buffers,
    divided by the micro-batch size)."""

    def bytes_of(self, picks: Sequence[Recompute]) -> float:
        """Activation bytes per sequence of an assignment (one policy per layer)."""
        kept, back = self.fixed_bytes, -math.inf
        for choice, pick in zip(self.choices, picks, strict=True):
            if choice is None:
                continue
            if pick == Recompute.FULL:
                kept += choice.full_bytes
                back = max(back, choice.back_bytes)
            elif pick == Recompute.SELECTIVE:
                kept += choice.selective_bytes
            else:
                kept += choice.none_bytes
        return self.inflight * kept + max(0.0, self.transient_bytes, back - self.head_bytes)

    def seconds_of(self, picks: Sequence[Recompute]) -> float:
        """Recompute seconds per micro-batch of an assignment."""
        total = 0.0
        for choice, pick in zip(self.choices, picks, strict=True):
            if choice is not None and pick == Recompute.FULL:
                total += choice.full_s
            elif choice is not None and pick == Recompute.SELECTIVE:
                total += choice.selective_s
        return total


def solve_stage(problem: StageProblem) -> tuple[Recompute, ...] | None:
    """The assignment with the least recompute time whose bytes fit the budget (ties: fewer
    `full`, then fewer `selective` blocks, `full` on the earliest blocks); None if even the
    least-memory assignment does not fit."""
    n = len(problem.choices)
    none = tuple(Recompute.NONE for _ in range(n))
    slack = _REL * max(1.0, abs(problem.budget_bytes))
    if problem.bytes_of(none) <= problem.budget_bytes + slack:
        return none
    idx = [i for i, c in enumerate(problem.choices) if c is not None]
    if not idx:
        return None
    caps = sorted({problem.choices[i].back_bytes for i in idx})  # type: ignore[union-attr]
    best: tuple[tuple[float, int, int], tuple[Recompute, ...]] | None = None
    groups = _groups(problem, idx)  # the same under every cap
    for cap in [None, *caps]:
        transient = max(0.0, problem.transient_bytes)
        if cap is not None:
            transient = max(transient, cap - problem.head_bytes)
        if problem.inflight <= 0:
            continue
        room = (problem.budget_bytes + slack - transient) / problem.inflight - problem.fixed_bytes
        picks = _knapsack(problem, idx, cap, room, groups)
        if picks is None:
            continue
        full = sum(p == Recompute.FULL for p in picks)
        sel = sum(p == Recompute.SELECTIVE for p in picks)
        key = (problem.seconds_of(picks), full, sel)
        if best is None or key < best[0]:
            best = (key, picks)
    return None if best is None else best[1]


Relaxation = tuple[float, tuple[tuple[float, float, int], ...]]
"""What `least_recompute_s` reads of a stage's choices: the bytes its blocks keep without
recompute, and the segments of its relaxation (seconds per byte saved, bytes, blocks), sorted
(`relaxation`)."""


def relaxation(choices: Sequence[LayerChoice | None]) -> Relaxation:
    """The part of `least_recompute_s` that depends on the choices alone (blocks that share a
    `LayerChoice` object are counted together)."""
    counts = Counter(id(c) for c in choices if c is not None)
    by_id = {id(c): c for c in choices if c is not None}
    none_bytes = sum(by_id[k].none_bytes * n for k, n in counts.items())
    segments: list[tuple[float, float, int]] = []  # (seconds per byte, bytes, blocks)
    for k, n in counts.items():
        c = by_id[k]
        sel = (c.none_bytes - c.selective_bytes, c.selective_s)
        full = (c.none_bytes - c.full_bytes, c.full_s)
        least: dict[float, float] = {}  # seconds of each saving (the cheaper of equal ones)
        for saved, secs in (sel, full):
            if saved > 0 and secs < least.get(saved, float("inf")):
                least[saved] = secs
        points = sorted(least.items())
        at = (0.0, 0.0)
        for saved, secs in _hull(points):
            segments.append(((secs - at[1]) / (saved - at[0]), saved - at[0], n))
            at = (saved, secs)
    return none_bytes, tuple(sorted(segments))


def least_recompute_s(problem: StageProblem, relaxed: Relaxation | None = None) -> float:
    """A lower bound on the recompute seconds of `solve_stage`'s answer when it has one: the
    linear relaxation of its knapsack (each block may recompute a fraction of its selective
    or full saving, at the lower convex hull of the two; the transient at its least, T0, and
    `full` allowed on every block), solved greedily by seconds per byte saved. 0 when even
    that cannot free enough (the solver then finds nothing either). `relaxed`: the
    `relaxation` of its choices, when known."""
    if problem.inflight <= 0:
        return 0.0
    slack = _REL * max(1.0, abs(problem.budget_bytes))
    transient = max(0.0, problem.transient_bytes)
    room = (problem.budget_bytes + slack - transient) / problem.inflight - problem.fixed_bytes
    none_bytes, segments = relaxation(problem.choices) if relaxed is None else relaxed
    need = none_bytes - room
    if need <= 0:
        return 0.0
    total = 0.0
    for rate, saved, n in segments:
        take = min(need, saved * n)
        total += rate * take
        need -= take
        if need <= 0:
            return total * (1.0 - _LP_MARGIN)
    return 0.0


def relaxation_fits(problem: StageProblem, relaxed: Relaxation | None = None) -> bool:
    """Whether `least_recompute_s`'s relaxation can free the bytes the budget asks for (up to
    a relative `_LP_MARGIN` beyond what its blocks can free, which covers the closed form's
    accepted shortfall). False: no assignment fits, so `solve_stage` returns None (each block
    frees at most its largest saving, and the transient is at least T0 under every cap)."""
    if problem.inflight <= 0:
        return True
    slack = _REL * max(1.0, abs(problem.budget_bytes))
    transient = max(0.0, problem.transient_bytes)
    room = (problem.budget_bytes + slack - transient) / problem.inflight - problem.fixed_bytes
    none_bytes, segments = relaxation(problem.choices) if relaxed is None else relaxed
    freeable = sum(saved * n for _, saved, n in segments)
    return none_bytes - room <= freeable * (1.0 + _LP_MARGIN)


def _hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull from (0, 0) through `points` (bytes saved, seconds), sorted by
    bytes: the options a fractional choice would mix."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while hull:
            a = hull[-2] if len(hull) > 1 else (0.0, 0.0)
            b = hull[-1]
            # drop b when it lies on or above the line from a to p
            if (b[1] - a[1]) * (p[0] - a[0]) >= (p[1] - a[1]) * (b[0] - a[0]):
                hull.pop()
            else:
                break
        hull.append(p)
    return [p for p in hull if p[1] >= 0.0]


def _groups(problem: StageProblem, idx: list[int]) -> tuple[list[int], list[int]]:
    """The positions of the stage's most common block and of the others."""
    # Identical layers share one LayerChoice object (the evaluator builds them so): grouping by
    # identity is exact, and equal but distinct objects only fall into separate groups.
    counts = Counter(id(problem.choices[i]) for i in idx)
    main_id = counts.most_common(1)[0][0]
    group = [i for i in idx if id(problem.choices[i]) == main_id]
    others = [i for i in idx if id(problem.choices[i]) != main_id]
    return group, others


def _knapsack(
    problem: StageProblem,
    idx: list[int],
    cap: float | None,
    room: float,
    groups: tuple[list[int], list[int]] | None = None,
) -> tuple[Recompute, ...] | None:
    """Least-time picks with sum of kept bytes <= room, `full` only for back <= cap
    (`groups`: `_groups(problem, idx)`, when already known)."""
    group, others = _groups(problem, idx) if groups is None else groups
    main = problem.choices[group[0]]
    if len(others) > MAX_OUTLIERS:
        return _dynamic(problem, idx, cap, room)
    best: tuple[tuple[float, int, int], tuple[Recompute, ...]] | None = None
    unlike = [c for c in (problem.choices[i] for i in others) if c is not None]
    for combo in itertools.product(*(_allowed(c, cap) for c in unlike)):
        used = sum(_kept(c, r) for c, r in zip(unlike, combo, strict=True))
        picks = _identical(problem, group, main, cap, room - used)  # type: ignore[arg-type]
        if picks is None:
            continue
        merged = list(picks)
        for i, r in zip(others, combo, strict=True):
            merged[i] = r
        key = (
            problem.seconds_of(merged),
            merged.count(Recompute.FULL),
            merged.count(Recompute.SELECTIVE),
        )
        if best is None or key < best[0]:
            best = (key, tuple(merged))
    return None if best is None else best[1]


def _allowed(c: LayerChoice, cap: float | None) -> tuple[Recompute, ...]:
    """The policies a block may take under the cap on `full` blocks' re-materialization."""
    if cap is not None and c.back_bytes <= cap:
        return POLICIES
    return POLICIES[:2]


def _kept(c: LayerChoice, r: Recompute) -> float:
    """Bytes per sequence a block keeps under policy `r`."""
    if r == Recompute.FULL:
        return c.full_bytes
    return c.selective_bytes if r == Recompute.SELECTIVE else c.none_bytes


def _identical(
    problem: StageProblem, idx: list[int], c: LayerChoice, cap: float | None, room: float
) -> tuple[Recompute, ...] | None:
    """Closed form over counts for identical blocks: for each count of `full` blocks, the
    fewest `selective` ones that fit."""
    count = len(idx)
    allow_full = cap is not None and c.back_bytes <= cap
    best: tuple[tuple[float, int, int], int, int] | None = None
    for n_full in range(count + 1 if allow_full else 1):
        rest = count - n_full
        deficit = n_full * c.full_bytes + rest * c.none_bytes - room
        gain = c.none_bytes - c.selective_bytes
        if deficit <= 0:
            n_sel = 0
        elif gain > 0:
            n_sel = math.ceil(deficit / gain - 1e-9)
            if n_sel > rest:
                continue
        else:
            continue
        key = (n_full * c.full_s + n_sel * c.selective_s, n_full, n_sel)
        if best is None or key < best[0]:
            best = (key, n_full, n_sel)
    if best is None:
        return None
    _, n_full, n_sel = best
    picks = [Recompute.NONE] * len(problem.choices)
    for k, i in enumerate(idx):
        if k < n_full:
            picks[i] = Recompute.FULL
        elif k < n_full + n_sel:
            picks[i] = Recompute.SELECTIVE
    return tuple(picks)


def _dynamic(
    problem: StageProblem, idx: list[int], cap: float | None, room: float
) -> tuple[Recompute, ...] | None:
    """Dynamic program over the bytes to free (in units, savings rounded down)."""
    import numpy as np

    choices = [c for c in (problem.choices[i] for i in idx) if c is not None]
    need = sum(c.none_bytes for c in choices) - room
    if need <= 0:
        return tuple(Recompute.NONE for _ in problem.choices)
    unit = need / MAX_UNITS if need > MAX_UNITS else 1.0
    units = math.ceil(need / unit - 1e-9)
    inf = math.inf
    dp = np.full(units + 1, inf)
    dp[0] = 0.0
    picks_table = []
    k = np.arange(units + 1)
    for c in choices:
        options = [(Recompute.SELECTIVE, c.none_bytes - c.selective_bytes, c.selective_s)]
        if cap is not None and c.back_bytes <= cap:
            options.append((Recompute.FULL, c.none_bytes - c.full_bytes, c.full_s))
        new = dp.copy()
        pick = np.zeros(units + 1, dtype=np.int8)
        for code, (_, saving, secs) in enumerate(options, start=1):
            step = math.floor(saving / unit + 1e-9)
            if step <= 0:
                continue
            cand = dp[np.maximum(k - step, 0)] + secs
            better = cand < new - 1e-15
            new = np.where(better, cand, new)
            pick = np.where(better, code, pick).astype(np.int8)
        picks_table.append((pick, options))
        dp = new
    if not math.isfinite(dp[units]):
        return None
    out = [Recompute.NONE] * len(problem.choices)
    at = units
    for pos in range(len(choices) - 1, -1, -1):
        pick, options = picks_table[pos]
        code = int(pick[at])
        if code:
            policy, saving, _ = options[code - 1]
            out[idx[pos]] = policy
            at = max(0, at - math.floor(saving / unit + 1e-9))
    return tuple(out)
