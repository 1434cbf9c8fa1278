"""Pipeline replays in bulk, for the cost model's split-backward terms (`cost/schedules.py`).

The cost model asks the makespan of one (schedule, pp, v, m) at many forward shares F/(F+B),
rounded to `RATIO_DIGITS` digits, and the in-flight peaks of each stage at F:B = 1:2. Both are
what `pipeline_replay.simulate_pipeline` replays, bit for bit:

- The replay of equal stages with no p2p time is a longest path over the operation graph
  (each operation starts when its stage's previous operation and the one it waits for have
  ended). For large schedules (`BULK_MIN_OPS`) operations are grouped by depth in that graph,
  and each group is computed for a block of rounded shares at once with numpy: the same
  additions and maxima on the same float64 values as the one-share replay, so every entry
  equals `makespan_s` at that share exactly. numpy is imported only then.
- The in-flight peaks are `Timeline.in_flight` computed from one replay's start and end
  times, without building the timeline's `Interval` objects.

`tests/test_replay_table.py` checks both against `simulate_pipeline` for every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from ..strategy import Schedule
from .pipeline_orders import Phase
from .pipeline_replay import chunk_placement, stage_order

if TYPE_CHECKING:
    import numpy as np

RATIO_DIGITS = 3
"""Digits the forward share is rounded to (the cost model's replay cache)."""
_STEPS = 10**RATIO_DIGITS
_BLOCK = 32
"""Shares replayed together (numpy's per-call cost dominates up to a few dozen columns)."""
BULK_MIN_OPS = 24000
"""Operations from which a schedule's makespans are replayed in bulk with numpy (a block of
shares then costs about one share's pure-Python replay; below it numpy's import and per-call
costs outweigh what they save)."""
_PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT)
"""Row of each phase in the seconds table."""


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
    orders = [
        stage_order(schedule, num_stages=pp, num_microbatches=m, virtual_stages=v, stage=s)
        for s in range(pp)
    ]
    row = {phase: i for i, phase in enumerate(_PHASES)}
    produced: dict[tuple[bool, int, int], int] = {}  # (gradient?, mb, chunk) -> position
    prevs: list[int] = []
    deps: list[int] = []
    phases: list[int] = []
    stages: list[int] = []
    pos, prev = [0] * pp, [-1] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                phase, mb, local = orders[s][pos[s]]
                chunk = model_chunk[(s, local)]
                need: tuple[bool, int, int] | None
                if phase == Phase.FORWARD:
                    need = (False, mb, chunk - 1) if chunk > 0 else None
                elif phase == Phase.BACKWARD_WEIGHT:
                    need = (True, mb, chunk)
                else:
                    need = (True, mb, chunk + 1) if chunk < last else (False, mb, chunk)
                dep = -1
                if need is not None:
                    if need not in produced:
                        break  # its input is not computed yet
                    dep = produced[need]
                here = len(prevs)
                prevs.append(prev[s])
                deps.append(dep)
                phases.append(row[phase])
                stages.append(s)
                if phase == Phase.FORWARD:
                    produced[(False, mb, chunk)] = here
                elif phase != Phase.BACKWARD_WEIGHT:
                    produced[(True, mb, chunk)] = here
                prev[s] = here
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:  # pragma: no cover - the orders never deadlock
            raise RuntimeError(f"{schedule} with pp={pp}, m={m}, v={v} deadlocks; this is a bug")
    return OpGraph(prev=tuple(prevs), dep=tuple(deps), phase=tuple(phases), stage=tuple(stages))


@lru_cache(maxsize=64)
def _levels(
    schedule: Schedule, pp: int, m: int, v: int
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]:
    """`op_graph`'s operations grouped by depth: (positions, previous positions, awaited
    positions, phases), with -1 replaced by the position of a row of zeros (one past the
    last)."""
    import numpy as np  # only for graphs large enough to be replayed in bulk

    graph = op_graph(schedule, pp, m, v)
    prevs, deps, n = graph.prev, graph.dep, len(graph.prev)
    depth = [0] * n
    for i in range(n):
        a = depth[prevs[i]] if prevs[i] >= 0 else 0
        b = depth[deps[i]] if deps[i] >= 0 else 0
        depth[i] = 1 + max(a, b)
    by_depth: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        by_depth.setdefault(d, []).append(i)
    levels = []
    for d in sorted(by_depth):
        idx = by_depth[d]
        levels.append(
            (
                np.array(idx),
                np.array([prevs[i] if prevs[i] >= 0 else n for i in idx]),
                np.array([deps[i] if deps[i] >= 0 else n for i in idx]),
                np.array([graph.phase[i] for i in idx]),
            )
        )
    return tuple(levels)


def _replay_bulk(schedule: Schedule, pp: int, m: int, v: int, seconds: np.ndarray) -> np.ndarray:
    """End of every operation, one column per column of `seconds` (4 phases x k)."""
    import numpy as np

    n = len(op_graph(schedule, pp, m, v).prev)
    ends = np.zeros((n + 1, seconds.shape[1]))  # the last row stays 0: "nothing before"
    for idx, prev, dep, phase in _levels(schedule, pp, m, v):
        ends[idx] = np.maximum(ends[prev], ends[dep]) + seconds[phase]
    return ends[:n]


@lru_cache(maxsize=4096)
def _makespans(
    schedule: Schedule, pp: int, v: int, m: int, share: float, block: int
) -> tuple[float, ...]:
    """`makespan_s` at the rounded forward shares k / 10**RATIO_DIGITS of one block of
    `_BLOCK` consecutive k (backward 1 - that): a block costs about what one share does."""
    import numpy as np

    first = block * _BLOCK
    fwd = np.array([k / _STEPS for k in range(first, min(first + _BLOCK, _STEPS + 1))])
    bwd = 1.0 - fwd
    seconds = np.stack((fwd / v, bwd / v, bwd * (1 - share) / v, bwd * share / v))
    return tuple(_replay_bulk(schedule, pp, m, v, seconds).max(axis=0).tolist())


def makespan_at(
    schedule: Schedule, *, pp: int, v: int, m: int, forward: float, share: float
) -> float | None:
    """`pipeline_replay.makespan_s` with forward seconds `forward` (a share rounded to
    `RATIO_DIGITS` digits) and backward `1.0 - forward`: from the table of its block of
    shares for schedules of `BULK_MIN_OPS` operations or more, else from one replay of
    `op_graph` (shared with `in_flight_peaks`); None when `forward` is not such a share."""
    k = round(forward * _STEPS)
    if not 0 <= k <= _STEPS or k / _STEPS != forward or not 0.0 <= share <= 1.0:
        return None
    if pp * m * v * 3 < BULK_MIN_OPS:  # at most 3 operations per micro-batch and chunk
        return max(_replay_once(schedule, pp, v, m, forward, 1.0 - forward, share)[1])
    return _makespans(schedule, pp, v, m, share, k // _BLOCK)[k % _BLOCK]


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
        if dep >= 0:
            start = max(start, ends[dep])
        starts.append(start)
        ends.append(start + seconds[phase])
    return starts, ends


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
    seconds per micro-batch (`simulate_pipeline`, equal stages, no p2p time)."""
    graph = op_graph(schedule, pp, m, v)
    starts, ends = _replay_once(schedule, pp, v, m, forward, backward, share)
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
