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
from dataclasses import dataclass
from enum import StrEnum

from ..strategy import Schedule


class Phase(StrEnum):
    """What an interval computes."""

    FORWARD = "forward"
    BACKWARD = "backward"


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
    """Model chunk index, 0 .. pp*v-1 (chunk c runs on stage c % pp)."""
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

    def stage_intervals(self, stage: int) -> tuple[Interval, ...]:
        """The operations of one stage, in the order they run."""
        return tuple(x for x in self.intervals if x.stage == stage)

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

    def in_flight(self, stage: int) -> float:
        """Peak number of micro-batches whose activations the stage holds, in units of the
        whole stage: (micro-batch, chunk) pairs from the start of their forward to the end of
        their backward, divided by v (what planner/cost/memory.py counts)."""
        events = []
        for x in self.stage_intervals(stage):
            if x.phase == Phase.FORWARD:
                events.append((x.start_s, 1, 1))
            else:
                events.append((x.end_s, 0, -1))  # at equal times a backward frees first
        held = peak = 0
        for _, _, delta in sorted(events):
            held += delta
            peak = max(peak, held)
        return peak / self.virtual_stages


Op = tuple[Phase, int, int]
"""(phase, micro-batch, local chunk 0..v-1) of one stage."""


def _check(schedule: Schedule, pp: int, m: int, v: int) -> None:
    for name, value in (("num_stages", pp), ("num_microbatches", m), ("virtual_stages", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if schedule == Schedule.NONE and pp != 1:
        raise ValueError(f"schedule 'none' means no pipeline; pp={pp} needs gpipe or 1f1b")
    if schedule != Schedule.NONE and pp == 1:
        raise ValueError(f"schedule {str(schedule)!r} needs pp >= 2; use 'none' for pp=1")
    if (schedule == Schedule.INTERLEAVED_1F1B) != (v > 1):
        raise ValueError(
            f"virtual_stages={v} with {str(schedule)!r}: use v > 1 exactly with interleaved_1f1b"
        )
    if schedule == Schedule.INTERLEAVED_1F1B and m % pp:
        raise ValueError(
            f"interleaved_1f1b needs the micro-batches (m={m}) to be a multiple of pp={pp} "
            "(Megatron-LM's rule); use m = a multiple of pp"
        )


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
    pp, m, v, s = num_stages, num_microbatches, virtual_stages, stage
    _check(sched, pp, m, v)
    F, B = Phase.FORWARD, Phase.BACKWARD
    if sched == Schedule.NONE:
        return [op for i in range(m) for op in ((F, i, 0), (B, i, 0))]
    if sched == Schedule.GPIPE:
        return [(F, i, 0) for i in range(m)] + [(B, i, 0) for i in range(m)]
    if sched == Schedule.ONE_F_ONE_B:
        warmup = min(pp - s - 1, m)
        order = [(F, i, 0) for i in range(warmup)]
        for k in range(m - warmup):
            order += [(F, warmup + k, 0), (B, k, 0)]
        return order + [(B, k, 0) for k in range(m - warmup, m)]

    if sched != Schedule.INTERLEAVED_1F1B:
        raise ValueError(
            f"no replay for schedule {str(sched)!r}; use none, gpipe, 1f1b or interleaved_1f1b"
        )

    def virtual(k: int, backward: bool) -> Op:
        local = (k // pp) % v
        mb = (k // (pp * v)) * pp + k % pp
        return (B, mb, v - 1 - local) if backward else (F, mb, local)

    total = m * v
    warmup = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    order = [virtual(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        order += [virtual(warmup + k, False), virtual(k, True)]
    return order + [virtual(k, True) for k in range(total - warmup, total)]


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
) -> Timeline:
    """Replay `schedule` and return every operation's interval.

    `forward_s` / `backward_s`: seconds of one micro-batch's forward / backward on each stage
    (one number for all stages, or one per stage), all of the stage's chunks together; a chunk
    takes 1/v of it. `p2p_s`: seconds an activation or gradient takes to reach the next stage
    (the sending stage does not wait for it)."""
    sched = Schedule(schedule)
    pp, m, v = num_stages, num_microbatches, virtual_stages
    _check(sched, pp, m, v)
    fwd = _per_stage("forward_s", forward_s, pp)
    bwd = _per_stage("backward_s", backward_s, pp)
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise ValueError(f"p2p_s={p2p_s!r} must be a finite number of seconds >= 0")
    last = pp * v - 1
    orders = [
        stage_order(sched, num_stages=pp, num_microbatches=m, virtual_stages=v, stage=s)
        for s in range(pp)
    ]
    done: dict[tuple[Phase, int, int], float] = {}  # (phase, micro-batch, model chunk) -> end
    free = [0.0] * pp
    pos = [0] * pp
    out: list[list[Interval]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                phase, mb, local = orders[s][pos[s]]
                chunk = local * pp + s
                if phase == Phase.FORWARD:
                    dep = (Phase.FORWARD, mb, chunk - 1) if chunk > 0 else None
                else:
                    dep = (
                        (Phase.BACKWARD, mb, chunk + 1)
                        if chunk < last
                        else (Phase.FORWARD, mb, chunk)
                    )
                if dep is not None and dep not in done:
                    break
                ready = 0.0
                if dep is not None:
                    ready = done[dep] + (p2p_s if dep[2] % pp != s else 0.0)
                start = max(free[s], ready)
                end = start + (fwd[s] if phase == Phase.FORWARD else bwd[s]) / v
                done[(phase, mb, chunk)] = end
                free[s] = end
                out[s].append(
                    Interval(
                        stage=s, phase=phase, microbatch=mb, chunk=chunk, start_s=start, end_s=end
                    )
                )
                pos[s] += 1
                remaining -= 1
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
