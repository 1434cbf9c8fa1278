"""Pipeline replays for the cost model's split-backward terms (`cost/schedules.py`), on one
operation graph per (schedule, pp, m, v).

The cost model asks the makespan of a schedule at many forward shares F/(F+B), rounded to
`RATIO_DIGITS` digits, and the in-flight peaks of each stage at F:B = 1:2, both bit for bit
what `pipeline_replay.simulate_pipeline` replays:

- With equal stages and no p2p time the replay is a longest path over the operation graph
  (each operation starts when its stage's previous operation and the one it waits for have
  ended): `makespan_at` runs `pipeline_replay.makespan_s`'s loop on `op_graph`.
- The in-flight peaks are `Timeline.in_flight` computed from one replay's start and end
  times, without building the timeline's `Interval` objects.

The graph is built once for both (building it, from torch's operation orders, costs more than
a replay on it). `tests/test_replay_table.py` checks both against `simulate_pipeline` for
every schedule.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .. import replay_store
from ..strategy import Schedule
from .pipeline_orders import PHASES
from .pipeline_replay import chunk_placement, stage_order_codes

RATIO_DIGITS = 3
"""Digits the forward share is rounded to (the cost model's replay cache)."""
_STEPS = 10**RATIO_DIGITS
_PHASES = PHASES
"""Row of each phase in the seconds table."""
_FORWARD, _WEIGHT = 0, 3
"""Rows of the forward and of the weight gradient."""


@dataclass(frozen=True, slots=True)
class OpGraph:
    """Every operation of a schedule once, in an order where each follows the operation its
    stage ran before it and the one it waits for (the order `simulate_pipeline` resolves them
    in)."""

    prev: tuple[int, ...]
    """Position of the stage's previous operation, or -1."""
    dep: tuple[int, ...]
    """Position of the operation whose output it waits for, or -1."""
    phase: tuple[int, ...]
    """Its phase, as a row of `_PHASES`."""
    stage: tuple[int, ...]
    """The stage that runs it."""


@lru_cache(maxsize=256)
def op_graph(schedule: Schedule, pp: int, m: int, v: int) -> OpGraph:
    """The operation graph of a (schedule, pp, m, v) (see `OpGraph`)."""
    last = pp * v - 1
    model_chunk = {chunk_placement(schedule, c, pp): c for c in range(pp * v)}
    chunk_of = [[model_chunk[(s, local)] for local in range(v)] for s in range(pp)]
    orders = _stage_orders(schedule, pp, m, v)
    width = pp * v + 1
    # (micro-batch, chunk, gradient?) -> position, at the int 2 (mb * width + chunk) + grad; -1:
    # not yet (a list: indexing it is cheaper than a dict's get)
    produced = [-1] * (2 * m * width)
    prevs: list[int] = []
    deps: list[int] = []
    phases: list[int] = []
    stages: list[int] = []
    pos, prev = [0] * pp, [-1] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            order, i, chunks, here = orders[s], pos[s], chunk_of[s], prev[s]
            n = len(order)
            while i < n:
                code = order[i]  # `op_code`: (mb * v + local) * 4 + row of its phase
                row, mb_local = code & 3, code >> 2
                mb = mb_local // v
                chunk = chunks[mb_local - mb * v]
                key = 2 * (mb * width + chunk)  # its (mb, chunk)'s forward; + 1: gradient
                if row == _FORWARD:
                    need = key - 2 if chunk > 0 else -1  # the previous chunk's forward
                elif row == _WEIGHT:
                    need = key + 1  # its own input gradient
                else:  # the next chunk's gradient, or the last chunk's own forward
                    need = key + 3 if chunk < last else key
                dep = -1
                if need >= 0:
                    dep = produced[need]
                    if dep < 0:
                        break  # its input is not computed yet
                prevs.append(here)
                here = len(deps)
                deps.append(dep)
                phases.append(row)
                stages.append(s)
                if row != _WEIGHT:
                    produced[key if row == _FORWARD else key + 1] = here
                i += 1
            if i != pos[s]:
                remaining -= i - pos[s]
                pos[s], prev[s] = i, here
                moved = True
        if not moved:  # pragma: no cover - the orders never deadlock
            raise RuntimeError(f"{schedule} with pp={pp}, m={m}, v={v} deadlocks; this is a bug")
    return OpGraph(prev=tuple(prevs), dep=tuple(deps), phase=tuple(phases), stage=tuple(stages))


def makespan_at(
    schedule: Schedule, *, pp: int, v: int, m: int, forward: float, share: float
) -> float | None:
    """`pipeline_replay.makespan_s` with forward seconds `forward` (a share rounded to
    `RATIO_DIGITS` digits) and backward `1.0 - forward`, replayed on `op_graph` (shared with
    `in_flight_peaks`); None when `forward` is not such a share."""
    k = round(forward * _STEPS)
    if not 0 <= k <= _STEPS or k / _STEPS != forward or not 0.0 <= share <= 1.0:
        return None
    return _makespan_once(schedule, pp, v, m, forward, 1.0 - forward, share)


def _makespan_once(
    schedule: Schedule, pp: int, v: int, m: int, forward: float, backward: float, share: float
) -> float:
    """`makespan_s`: the end of the last operation of one replay (its loop, on `op_graph`)."""
    graph = op_graph(schedule, pp, m, v)
    seconds = (forward / v, backward / v, backward * (1 - share) / v, backward * share / v)
    ends: list[float] = []
    for prev, dep, phase in zip(graph.prev, graph.dep, graph.phase, strict=True):
        start = ends[prev] if prev >= 0 else 0.0
        if dep >= 0 and ends[dep] > start:  # max(start, ends[dep]), without the call
            start = ends[dep]
        ends.append(start + seconds[phase])
    return max(ends)


Path = tuple[int, int, int, int]
"""Operations of a chain per phase (forward, backward, input gradient, weight gradient)."""
_PATH_MARGIN = 1e-11
"""Relative margin on a chain's length priced by counts: the replay sums the same seconds one
operation at a time (a few thousand additions, each within half an ulp)."""


def makespan_bound(paths: Iterable[Path], *, v: int, forward: float, share: float) -> float:
    """A lower bound on the makespan of a replay with these seconds (forward `forward`,
    backward `1 - forward`, `share` of it weight gradient) whose graph holds the chains
    `paths`: a chain of operations, each waiting for the one before, takes at least the sum
    of their seconds; less a rounding margin."""
    backward = 1.0 - forward
    f, b = forward / v, backward / v
    bi, bw = backward * (1 - share) / v, backward * share / v
    longest = max(nf * f + nb * b + ni * bi + nw * bw for nf, nb, ni, nw in paths)
    return longest * (1.0 - _PATH_MARGIN)


@lru_cache(maxsize=16)
def _replay_once(
    schedule: Schedule, pp: int, v: int, m: int, forward: float, backward: float, share: float
) -> tuple[list[float], list[float]]:
    """(starts, ends) of every operation of one replay (`makespan_s`'s loop)."""
    graph = op_graph(schedule, pp, m, v)
    seconds = (forward / v, backward / v, backward * (1 - share) / v, backward * share / v)
    starts: list[float] = []
    ends: list[float] = []
    for prev, dep, phase in zip(graph.prev, graph.dep, graph.phase, strict=True):
        start = ends[prev] if prev >= 0 else 0.0
        if dep >= 0 and ends[dep] > start:  # max(start, ends[dep]), without the call
            start = ends[dep]
        starts.append(start)
        ends.append(start + seconds[phase])
    return starts, ends


def _peaks(
    graph: OpGraph,
    starts: list[float],
    ends: list[float],
    pp: int,
    v: int,
    pending_weight: float,
) -> tuple[float, ...]:
    """`Timeline.in_flight(stage, pending_weight)` of every stage, from one replay's start
    and end times (the same events, sorted the same way)."""
    events: list[list[tuple[float, int, float]]] = [[] for _ in range(pp)]
    for i, (phase, stage) in enumerate(zip(graph.phase, graph.stage, strict=True)):
        if phase == 0:  # forward
            events[stage].append((starts[i], 1, 1.0))
        elif phase == 2:  # input gradient
            events[stage].append((ends[i], 1, pending_weight))
        elif phase == 3:  # weight gradient
            events[stage].append((ends[i], 0, -1.0 - pending_weight))
        else:
            events[stage].append((ends[i], 0, -1.0))  # at equal times a backward frees first
    out = []
    for stage_events in events:
        held = peak = 0.0
        for _, _, delta in sorted(stage_events):
            held += delta
            peak = max(peak, held)
        out.append(peak / v)
    return tuple(out)


def replay_stages(
    schedule: Schedule,
    *,
    pp: int,
    v: int,
    m: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    share: float,
    pending_weight: float,
) -> tuple[float, tuple[float, ...]]:
    """(makespan, `Timeline.in_flight(stage, pending_weight)` of every stage) of
    `simulate_pipeline` with these seconds per stage (one micro-batch's forward and backward,
    all its chunks), `share` of each backward its weight gradient, and no p2p time, bit for
    bit, without building the timeline: each operation starts when its stage's previous one
    and the one it waits for have ended, as the replay resolves them (on `op_graph`)."""
    seconds, in_order = _phase_seconds(pp, v, m, forward_s, backward_s, share)
    if in_order:  # no starts needed: each stage's events in order
        orders = _stage_orders(schedule, pp, m, v)
        return _resolved_makespan(schedule, orders, v, m, seconds), _peaks_in_order(
            orders, v, pending_weight
        )
    graph, starts, ends = _graph_times(schedule, pp, m, v, seconds)
    return max(ends), _peaks(graph, starts, ends, pp, v, pending_weight)


def replay_makespan(
    schedule: Schedule,
    *,
    pp: int,
    v: int,
    m: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    share: float,
) -> float:
    """`replay_stages`'s makespan alone (the same additions, bit for bit), without the
    in-flight peaks; or an earlier run's (`replay_store.py`, under a digest of the exact
    seconds: a plan's finalists are replayed with their stages' own times, 137k operations
    and 0.12 s for a 64-stage DualPipeV of 512 micro-batches, 2026-11-29)."""
    seconds, in_order = _phase_seconds(pp, v, m, forward_s, backward_s, share)
    args = (v, m, share, _digest(forward_s, backward_s))
    known = replay_store.STORE.get("makespan", schedule, pp, args)
    if isinstance(known, float):
        return known
    if in_order:
        orders = _stage_orders(schedule, pp, m, v)
        makespan = _resolved_makespan(schedule, orders, v, m, seconds)
    else:
        makespan = max(_graph_times(schedule, pp, m, v, seconds)[2])
    replay_store.STORE.put("makespan", schedule, pp, args, makespan)
    return makespan


def _digest(forward_s: Sequence[float], backward_s: Sequence[float]) -> str:
    """SHA-256 (32 hex digits) of the stages' seconds written exactly (`repr`)."""
    text = ",".join(repr(float(x)) for x in (*forward_s, *backward_s))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _phase_seconds(
    pp: int,
    v: int,
    m: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    share: float,
) -> tuple[list[float], bool]:
    """The seconds of each (stage, phase) as `simulate_pipeline` divides them, and whether
    the replay's events run in program order (`_in_program_order`); ValueError on bad input."""
    if len(forward_s) != pp or len(backward_s) != pp:
        raise ValueError(f"give one forward and one backward time per stage ({pp} stages)")
    for x in (*forward_s, *backward_s):
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"stage time {x!r} must be a finite number of seconds >= 0")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"weight_share {share} must lie in [0, 1]: it is a part of the backward")
    seconds = [  # (stage, phase) -> seconds, as `simulate_pipeline` divides them
        x
        for fwd, bwd in zip(forward_s, backward_s, strict=True)
        for x in (fwd / v, bwd / v, bwd * (1 - share) / v, bwd * share / v)
    ]
    work_s = m * sum(f + b for f, b in zip(forward_s, backward_s, strict=True))
    return seconds, _in_program_order(seconds, work_s)


def _graph_times(
    schedule: Schedule, pp: int, m: int, v: int, seconds: Sequence[float]
) -> tuple[OpGraph, list[float], list[float]]:
    """(`op_graph`, each operation's start, each one's end) of the replay on the graph."""
    graph = op_graph(schedule, pp, m, v)
    starts: list[float] = []
    ends: list[float] = []
    for prev, dep, phase, stage in zip(
        graph.prev, graph.dep, graph.phase, graph.stage, strict=True
    ):
        start = ends[prev] if prev >= 0 else 0.0
        if dep >= 0 and ends[dep] > start:  # max(start, ends[dep]), without the call
            start = ends[dep]
        starts.append(start)
        ends.append(start + seconds[4 * stage + phase])
    return graph, starts, ends


@lru_cache(maxsize=64)
def _stage_orders(schedule: Schedule, pp: int, m: int, v: int) -> tuple[tuple[int, ...], ...]:
    """Every stage's `op_code`s, in the order it runs them (memoized: `op_graph` and the
    in-flight peaks read the same orders)."""
    return tuple(
        tuple(
            stage_order_codes(
                schedule, num_stages=pp, num_microbatches=m, virtual_stages=v, stage=s
            )
        )
        for s in range(pp)
    )


def _resolved_makespan(
    schedule: Schedule, orders: Sequence[Sequence[int]], v: int, m: int, seconds: Sequence[float]
) -> float:
    """The makespan of the replay on `op_graph` with `seconds[4 * stage + row]` per operation,
    resolved as `op_graph` resolves the orders, without building the graph (the plan's replay
    runs once per graph: at pp=64, m=512 it has 137k operations). Each operation ends at
    max(its stage's previous end, its input's end) + its seconds, the same additions as the
    replay on the graph; a stage's ends never decrease (seconds are >= 0), so the largest end
    is the largest of the stages' last ends."""
    pp = len(orders)
    last = pp * v - 1
    model_chunk = {chunk_placement(schedule, c, pp): c for c in range(pp * v)}
    chunk_of = [[model_chunk[(s, local)] for local in range(v)] for s in range(pp)]
    width = pp * v + 1
    # `op_graph`'s keys -> the end of that operation (-1.0: not yet ended; ends are >= 0)
    produced = [-1.0] * (2 * m * width)
    pos, end = [0] * pp, [0.0] * pp  # 0.0: a stage's first operation starts at 0
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            order, i, chunks, here = orders[s], pos[s], chunk_of[s], end[s]
            n = len(order)
            row_s = 4 * s
            while i < n:
                code = order[i]
                row, mb_local = code & 3, code >> 2
                mb = mb_local // v
                chunk = chunks[mb_local - mb * v]
                key = 2 * (mb * width + chunk)
                if row == _FORWARD:
                    need = key - 2 if chunk > 0 else -1
                elif row == _WEIGHT:
                    need = key + 1
                else:
                    need = key + 3 if chunk < last else key
                if need >= 0:
                    found = produced[need]
                    if found < 0.0:
                        break  # its input is not computed yet
                    if found > here:
                        here = found
                here += seconds[row_s + row]
                if row != _WEIGHT:
                    produced[key if row == _FORWARD else key + 1] = here
                i += 1
            if i != pos[s]:
                remaining -= i - pos[s]
                pos[s], end[s] = i, here
                moved = True
        if not moved:  # pragma: no cover - the orders never deadlock
            raise RuntimeError(f"{schedule} with pp={pp}, v={v} deadlocks; this is a bug")
    return max(end)


def _peaks_in_order(
    orders: Sequence[Sequence[int]], v: int, pending_weight: float
) -> tuple[float, ...]:
    """`_order_peaks` of these stage orders."""
    delta = (1.0, -1.0, pending_weight, -1.0 - pending_weight)  # by row of `_PHASES`
    out = []
    for order in orders:
        held = itertools.accumulate(delta[code & 3] for code in order)
        out.append(max(0.0, *held) / v)
    return tuple(out)


_ORDER_MARGIN = 2.0**-40
"""An operation lasting more than this share of all the replay's work ends strictly after it
starts: every start is below that total, and a sum moves by at least the smaller term's
nearest ulp (2^-52 of the larger), far below this margin (`_in_program_order`)."""


def _in_program_order(seconds: Sequence[float], total_s: float) -> bool:
    """Whether every operation of a replay whose operations take `seconds` (each phase's, on
    every stage) and `total_s` all together ends strictly after it starts, so that each
    stage's events of `Timeline.in_flight` sort in the order the stage runs them.

    A stage runs one operation at a time: each starts no earlier than the previous one ended.
    An event is a forward's start or another operation's end, so with every operation of
    positive length (in floating point) the events of two operations i < j of a stage are
    at t_i < t_j, except a forward j starting exactly when the operation i before it ends:
    then i's end comes first in the sort as well (a backward or weight gradient sorts first at
    equal times; an input gradient's `pending_weight` is below a forward's 1). No stage idles
    while another waits on it, so the replay ends before `total_s` (some stage is always
    busy): every start is below it."""
    return min(seconds) > total_s * _ORDER_MARGIN


def _order_peaks(
    schedule: Schedule, pp: int, v: int, m: int, pending_weight: float
) -> tuple[float, ...]:
    """`Timeline.in_flight(stage, pending_weight)` of every stage whose events sort in the order
    it runs its operations (`_in_program_order`): the running sum over that order, with no
    replay (the same additions in the same order as the sorted events)."""
    return _peaks_in_order(_stage_orders(schedule, pp, m, v), v, pending_weight)


@lru_cache(maxsize=1024)
def in_flight_peaks(
    schedule: Schedule,
    pp: int,
    v: int,
    m: int,
    forward: float,
    backward: float,
    share: float,
    pending_weight: float,
) -> tuple[float, ...]:
    """`Timeline.in_flight(stage, pending_weight)` of every stage of the replay with these
    seconds per micro-batch (`simulate_pipeline`, equal stages, no p2p time): read off each
    stage's order when every operation lasts (`_in_program_order`), else replayed; or read
    from an earlier run's (`replay_store.py`)."""
    args = (v, m, forward, backward, share, pending_weight)
    known = replay_store.STORE.get("peaks", schedule, pp, args)
    if isinstance(known, tuple) and len(known) == pp:
        return known
    seconds = (forward / v, backward / v, backward * (1 - share) / v, backward * share / v)
    if _in_program_order(seconds, pp * m * (forward + backward)):
        peaks = _order_peaks(schedule, pp, v, m, pending_weight)
    else:
        peaks = replayed_peaks(schedule, pp, v, m, forward, backward, share, pending_weight)
    replay_store.STORE.put("peaks", schedule, pp, args, peaks)
    return peaks


def replayed_peaks(
    schedule: Schedule,
    pp: int,
    v: int,
    m: int,
    forward: float,
    backward: float,
    share: float,
    pending_weight: float,
) -> tuple[float, ...]:
    """`in_flight_peaks` from a replay's start and end times, whatever the seconds."""
    graph = op_graph(schedule, pp, m, v)
    starts, ends = _replay_once(schedule, pp, v, m, forward, backward, share)
    return _peaks(graph, starts, ends, pp, v, pending_weight)
