"""Pipeline schedules replayed over time: which stage runs which micro-batch when.


The model: `pp` stages; stage s runs the model chunks c with ``c % pp == s`` (v chunks each for
interleaving, Narayanan et al. 2021 §2.2.2). Each stage runs its operations one at a time in
the fixed order its schedule prescribes; an operation starts once its stage is free and its
input has arrived: the forward of micro-batch i on chunk c needs chunk c-1's forward of i (plus
`p2p_s` when c-1 is on another stage), the backward on chunk c needs chunk c+1's backward of i
(plus `p2p_s`), and the last chunk's backward needs its own forward.

Orders per stage:

- GPipe (Huang et al. 2019 §2.2): every forward, then every backward, micro-batches in order.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): ``min(pp - s - 1, m)`` warm-up
  forwards, then one forward and one backward alternately, then the remaining backwards.
- Interleaved 1F1B (Narayanan et al. 2021 §2.2.2), in Megatron-LM's order
  (`forward_backward_pipelining_with_interleaving`, `get_model_chunk_id`): virtual micro-batch
  k runs local chunk ``(k // pp) % v`` (backward: ``v - 1 -`` that) of micro-batch
  ``(k // (pp * v)) * pp + k % pp``, after ``min(2 (pp - s - 1) + (v - 1) pp, m v)`` warm-up
  forwards. It needs m to be a multiple of pp. (Megatron-LM runs every forward first when
  m == pp; this replay keeps the general order, whose memory the cost model counts.)

With equal stages and no p2p time the makespan is ``(m + (pp - 1) / v) * (t_f + t_b)``, the
cost model's pipeline time (planner/cost/evaluate.py), and the activations in flight are those
of planner/cost/memory.py `in_flight_microbatches`; tests check both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..strategy import Schedule
from .pipeline_orders import Op, Phase, decode, stage_codes, v_chunk_stage

V_SHAPED = (Schedule.ZBV, Schedule.DUALPIPEV)
"""Schedules with two chunks per stage in a V (`pipeline_orders.v_chunk_stage`)."""
SPLIT_BACKWARD = (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV)
"""Schedules that run some backwards as an input-gradient and a weight-gradient part."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Interval:
    """One operation of one stage."""

    stage: int
    """Pipeline stage (rank) that runs it."""
    phase: Phase
    """Forward or backward."""
    microbatch: int
    """Micro-batch index, 0 .. m-1."""
    chunk: int
    """Model chunk index, 0 .. pp*v-1 (chunk c runs on stage c % pp; in a V on
    `v_chunk_stage`)."""
    start_s: float
    """Start time from the beginning of the step."""
    end_s: float
    """End time."""

    @property
    def duration_s(self) -> float:
        """Seconds the stage is busy with it."""
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    """A replayed pipeline schedule."""

    schedule: Schedule
    """The schedule replayed."""
    num_stages: int
    """Pipeline stages (pp)."""
    num_microbatches: int
    """Micro-batches per step (m)."""
    virtual_stages: int
    """Model chunks per stage (v)."""
    intervals: tuple[Interval, ...]
    """Every operation, ordered by stage then start time."""
    makespan_s: float
    """End of the last operation."""
    _by_stage: dict[int, tuple[Interval, ...]] = field(init=False, repr=False, compare=False)
    """`intervals` split by stage (the cost model asks each stage's peak in turn)."""

    def __post_init__(self) -> None:
        by_stage: dict[int, list[Interval]] = {}
        for x in self.intervals:
            by_stage.setdefault(x.stage, []).append(x)
        object.__setattr__(self, "_by_stage", {k: tuple(v) for k, v in by_stage.items()})

    def stage_intervals(self, stage: int) -> tuple[Interval, ...]:
        """The operations of one stage, in the order they run."""
        return self._by_stage.get(stage, ())

    def busy_s(self, stage: int) -> float:
        """Seconds the stage computes."""
        return sum(x.duration_s for x in self.stage_intervals(stage))

    def idle_fraction(self, stage: int) -> float:
        """Share of the makespan the stage waits (its fill, drain and stalls)."""
        return 1.0 - self.busy_s(stage) / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the busiest stage: the cost model's `bubble_fraction`."""
        return min(self.idle_fraction(s) for s in range(self.num_stages))

    def in_flight(self, stage: int, pending_weight: float = 0.0) -> float:
        """Peak number of micro-batches whose activations the stage holds, in units of the
        whole stage: (micro-batch, chunk) pairs from the start of their forward to the end of
        their backward (of its weight-gradient part W when split), divided by v (what
        planner/cost/memory.py counts). Each pair whose input gradient is done but whose W is
        not counts `pending_weight` more (the output gradients W keeps,
        planner/cost/schedules.py)."""
        events: list[tuple[float, int, float]] = []
        for x in self.stage_intervals(stage):
            if x.phase == Phase.FORWARD:
                events.append((x.start_s, 1, 1.0))
            elif x.phase == Phase.BACKWARD_INPUT:
                events.append((x.end_s, 1, pending_weight))
            elif x.phase == Phase.BACKWARD_WEIGHT:
                events.append((x.end_s, 0, -1.0 - pending_weight))
            else:
                events.append((x.end_s, 0, -1.0))  # at equal times a backward frees first
        held = peak = 0.0
        for _, _, delta in sorted(events):
            held += delta
            peak = max(peak, held)
        return peak / self.virtual_stages


_Step = tuple[
    Phase,
    int,
    int,
    tuple[dict[tuple[int, int], float], tuple[int, int]] | None,
    float,
    float,
    dict[tuple[int, int], float] | None,
]
"""One operation of `simulate_pipeline`, resolved before the replay."""


def _check(schedule: Schedule, pp: int, m: int, v: int) -> None:
    for name, value in (("num_stages", pp), ("num_microbatches", m), ("virtual_stages", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if schedule == Schedule.NONE and pp != 1:
        raise ValueError(f"schedule 'none' means no pipeline; pp={pp} needs gpipe or 1f1b")
    if schedule != Schedule.NONE and pp == 1:
        raise ValueError(f"schedule {str(schedule)!r} needs pp >= 2; use 'none' for pp=1")
    if schedule in V_SHAPED and v != 2:
        raise ValueError(f"{str(schedule)!r} places two chunks per stage in a V; use v=2, not {v}")
    if schedule == Schedule.DUALPIPEV and m < 2 * pp:
        raise ValueError(
            f"dualpipev needs at least 2*pp={2 * pp} micro-batches (torch's rule), not m={m}; "
            "raise the batch or lower micro_batch_size"
        )
    loop_only = schedule not in V_SHAPED and schedule != Schedule.INTERLEAVED_ZB
    if loop_only and (schedule == Schedule.INTERLEAVED_1F1B) != (v > 1):
        raise ValueError(
            f"virtual_stages={v} with {str(schedule)!r}: use v > 1 exactly with interleaved_1f1b"
        )
    if schedule in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB) and m % pp:
        raise ValueError(
            f"{schedule} needs the micro-batches (m={m}) to be a multiple of pp={pp} "
            "(Megatron-LM's rule); use m = a multiple of pp"
        )


def chunk_placement(schedule: Schedule, chunk: int, pp: int) -> tuple[int, int]:
    """(stage, local chunk) of model chunk `chunk`: a loop (c % pp) or, for the V-shaped
    schedules, a V."""
    return v_chunk_stage(chunk, pp) if schedule in V_SHAPED else (chunk % pp, chunk // pp)


def stage_order(
    schedule: Schedule | str,
    *,
    num_stages: int,
    num_microbatches: int,
    virtual_stages: int,
    stage: int,
) -> list[Op]:
    """The operations `stage` runs, in order (see the module docstring)."""
    sched = Schedule(schedule)
    pp, m, v = num_stages, num_microbatches, virtual_stages
    _check(sched, pp, m, v)
    return decode(stage_codes(sched, pp, m, v, stage), v)


def stage_order_codes(
    schedule: Schedule, *, num_stages: int, num_microbatches: int, virtual_stages: int, stage: int
) -> list[int]:
    """`stage_order` as `pipeline_orders.op_code`s (no tuple per operation)."""
    pp, m, v = num_stages, num_microbatches, virtual_stages
    _check(schedule, pp, m, v)
    return stage_codes(schedule, pp, m, v, stage)


def _per_stage(name: str, value: float | Sequence[float], pp: int) -> list[float]:
    values = [float(value)] * pp if isinstance(value, int | float) else [float(x) for x in value]
    if len(values) != pp:
        raise ValueError(f"{name} has {len(values)} entries for {pp} stages; give one per stage")
    for x in values:
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name}: {x!r} must be a finite number of seconds >= 0")
    return values


def simulate_pipeline(
    schedule: Schedule | str,
    *,
    num_stages: int,
    num_microbatches: int,
    forward_s: float | Sequence[float],
    backward_s: float | Sequence[float],
    virtual_stages: int = 1,
    p2p_s: float = 0.0,
    weight_share: float | Sequence[float] = 0.5,
) -> Timeline:
    """Replay `schedule` and return every operation's interval.

    `forward_s` / `backward_s`: seconds of one micro-batch's forward / backward on each stage
    (one number for all stages, or one per stage), all of the stage's chunks together; a chunk
    takes 1/v of it. `p2p_s`: seconds an activation or gradient takes to reach the next stage
    (the sending stage does not wait for it). `weight_share`: the part of a backward that is
    the weight gradient (W), which the split-backward schedules run apart from the input
    gradient (per stage or one for all)."""
    sched = Schedule(schedule)
    pp, m, v = num_stages, num_microbatches, virtual_stages
    _check(sched, pp, m, v)
    fwd = _per_stage("forward_s", forward_s, pp)
    bwd = _per_stage("backward_s", backward_s, pp)
    share = _per_stage("weight_share", weight_share, pp)
    if any(x > 1 for x in share):
        raise ValueError(f"weight_share {share} must lie in [0, 1]: it is a part of the backward")
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise ValueError(f"p2p_s={p2p_s!r} must be a finite number of seconds >= 0")
    last = pp * v - 1
    where = {c: chunk_placement(sched, c, pp) for c in range(pp * v)}
    model_chunk = {st_local: c for c, st_local in where.items()}
    orders = [
        stage_order(sched, num_stages=pp, num_microbatches=m, virtual_stages=v, stage=s)
        for s in range(pp)
    ]
    seconds = [
        {
            Phase.FORWARD: fwd[s] / v,
            Phase.BACKWARD: bwd[s] / v,
            Phase.BACKWARD_INPUT: bwd[s] * (1 - share[s]) / v,
            Phase.BACKWARD_WEIGHT: bwd[s] * share[s] / v,
        }
        for s in range(pp)
    ]
    # (micro-batch, model chunk) -> end of its forward / of its input gradient ("grad": a
    # whole backward, or a split backward's B)
    forward_end: dict[tuple[int, int], float] = {}
    grad_end: dict[tuple[int, int], float] = {}
    # Each operation resolved once: (phase, micro-batch, chunk, the table and key it waits
    # for, the p2p hop that adds, its seconds, the table its end goes to).
    steps: list[list[_Step]] = []
    for s in range(pp):
        row: list[_Step] = []
        for phase, mb, local in orders[s]:
            chunk = model_chunk[(s, local)]
            dep: tuple[dict[tuple[int, int], float], tuple[int, int]] | None
            if phase == Phase.FORWARD:
                dep = (forward_end, (mb, chunk - 1)) if chunk > 0 else None
            elif phase == Phase.BACKWARD_WEIGHT:
                dep = (grad_end, (mb, chunk))
            else:
                dep = (grad_end, (mb, chunk + 1)) if chunk < last else (forward_end, (mb, chunk))
            hop = p2p_s if dep is not None and where[dep[1][1]][0] != s else 0.0
            target = (
                forward_end
                if phase == Phase.FORWARD
                else grad_end
                if phase in (Phase.BACKWARD, Phase.BACKWARD_INPUT)
                else None
            )
            row.append((phase, mb, chunk, dep, hop, seconds[s][phase], target))
        steps.append(row)
    free = [0.0] * pp
    pos = [0] * pp
    out: list[list[Interval]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            row, i, busy_until, ran = steps[s], pos[s], free[s], out[s]
            while i < len(row):
                phase, mb, chunk, dep, hop, duration_s, target = row[i]
                ready = 0.0
                if dep is not None:
                    dep_end = dep[0].get(dep[1])
                    if dep_end is None:
                        break  # its input is not computed yet
                    ready = dep_end + hop
                start = max(busy_until, ready)
                end = start + duration_s
                if target is not None:
                    target[(mb, chunk)] = end
                busy_until = end
                ran.append(
                    Interval(
                        stage=s, phase=phase, microbatch=mb, chunk=chunk, start_s=start, end_s=end
                    )
                )
                i += 1
            if i != pos[s]:
                remaining -= i - pos[s]
                pos[s], free[s] = i, busy_until
                moved = True
        if not moved:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError(f"{sched} with pp={pp}, m={m}, v={v} deadlocks; this is a bug")
    intervals = tuple(x for stage in out for x in stage)
    return Timeline(
        schedule=sched,
        num_stages=pp,
        num_microbatches=m,
        virtual_stages=v,
        intervals=intervals,
        makespan_s=max(x.end_s for x in intervals),
    )


_PHASE_INDEX = {
    Phase.FORWARD: 0,
    Phase.BACKWARD: 1,
    Phase.BACKWARD_INPUT: 2,
    Phase.BACKWARD_WEIGHT: 3,
}
"""Where each phase's seconds sit in `makespan_s`'s table."""


@lru_cache(maxsize=512)
def _op_graph(sched: Schedule, pp: int, m: int, v: int) -> tuple[tuple[int, int, int], ...]:
    """Every operation of the schedule once, in an order where each follows the operation
    its stage ran before it and the one whose output it waits for (the order
    `simulate_pipeline` resolves them in): (that previous operation's position or -1, the
    awaited one's or -1, `_PHASE_INDEX` of its phase)."""
    last = pp * v - 1
    model_chunk = {chunk_placement(sched, c, pp): c for c in range(pp * v)}
    orders = [
        stage_order(sched, num_stages=pp, num_microbatches=m, virtual_stages=v, stage=s)
        for s in range(pp)
    ]
    produced: dict[tuple[bool, int, int], int] = {}  # (gradient?, mb, chunk) -> position
    graph: list[tuple[int, int, int]] = []
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
                here = len(graph)
                graph.append((prev[s], dep, _PHASE_INDEX[phase]))
                if phase == Phase.FORWARD:
                    produced[(False, mb, chunk)] = here
                elif phase != Phase.BACKWARD_WEIGHT:
                    produced[(True, mb, chunk)] = here
                prev[s] = here
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:  # pragma: no cover - the orders never deadlock
            raise RuntimeError(f"{sched} with pp={pp}, m={m}, v={v} deadlocks; this is a bug")
    return tuple(graph)


def makespan_s(
    schedule: Schedule | str,
    *,
    num_stages: int,
    num_microbatches: int,
    forward_s: float,
    backward_s: float,
    virtual_stages: int = 1,
    weight_share: float = 0.5,
) -> float:
    """`simulate_pipeline(...).makespan_s` for equal stages and no p2p time, bit for bit,
    without building the timeline: the cost model asks it for many F:B ratios
    (`cost/schedules.py`), and the operation graph of a (schedule, pp, m, v) is kept."""
    sched = Schedule(schedule)
    pp, m, v = num_stages, num_microbatches, virtual_stages
    _check(sched, pp, m, v)
    (fwd,) = _per_stage("forward_s", forward_s, 1)
    (bwd,) = _per_stage("backward_s", backward_s, 1)
    (share,) = _per_stage("weight_share", weight_share, 1)
    if share > 1:
        raise ValueError(f"weight_share {share} must lie in [0, 1]: it is a part of the backward")
    seconds = (fwd / v, bwd / v, bwd * (1 - share) / v, bwd * share / v)
    ends: list[float] = []
    for prev, dep, phase in _op_graph(sched, pp, m, v):
        start = ends[prev] if prev >= 0 else 0.0
        if dep >= 0:
            start = max(start, ends[dep])
        ends.append(start + seconds[phase])
    return max(ends)
