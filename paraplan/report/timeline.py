"""Pipeline schedule pictures: the stage times of a plan, and the schedules replayed with them
for the Gantt charts. The replay itself is the planner's
(`paraplan.planner.solvers.pipeline_replay`), which also replays every plan the search returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..planner.solvers.pipeline_replay import (
    Timeline,
    simulate_pipeline,
)
from ..planner.strategy import Schedule

if TYPE_CHECKING:
    from ..planner.plan import Plan

BACKWARD_TO_FORWARD = 2.0
"""A backward does about twice the FLOPs of its forward (input and weight gradients; Narayanan
et al. 2021 §5.1): how a plan's per-micro-batch time is split into forward and backward."""
GANTT_MIN_MICROBATCHES = 8
"""A Gantt chart shows at least this many micro-batches (or the plan's m, if fewer)..."""
GANTT_STAGE_FACTOR = 2
"""...and at most this many per stage: enough to show fill, steady state and drain."""
DEFAULT_INTERLEAVE = 2
"""Chunks per stage of the interleaved panel when the plan does not interleave itself."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTimes:
    """One micro-batch's time on a pipeline stage, from a plan's predictions."""

    forward_s: float
    """Forward seconds of one micro-batch on the bounding stage (all its chunks)."""
    backward_s: float
    """Backward seconds, with recomputation and the stage's per-micro-batch communication."""

    @property
    def slot_s(self) -> float:
        """Forward plus backward: the cost model's time per pipeline slot."""
        return self.forward_s + self.backward_s


def stage_times(plan: Plan) -> StageTimes:
    """Per-micro-batch stage times of a pipelined plan, as its cost model priced them.

    The cost model's bubble is ``(pp - 1) / v`` slots (planner/cost/evaluate.py), so a slot is
    ``bubble_s * v / (pp - 1)``; it splits into forward and backward as 1 : `BACKWARD_TO_FORWARD`
    after taking the recomputation out (which runs in the backward)."""
    p = plan.parallelism
    if p.pp < 2:
        raise ValueError(f"the plan has pp={p.pp}: no pipeline to draw; use a plan with pp >= 2")
    tb = plan.predicted.time_breakdown
    m = plan.num_microbatches
    slot = tb.bubble_s * p.virtual_stages / (p.pp - 1)
    recompute = tb.recompute_s / m
    forward = max(0.0, slot - recompute) / (1.0 + BACKWARD_TO_FORWARD)
    return StageTimes(forward_s=forward, backward_s=slot - forward)


def gantt_microbatches(num_microbatches: int, num_stages: int) -> int:
    """How many micro-batches a Gantt chart shows: the plan's m, capped at
    max(`GANTT_MIN_MICROBATCHES`, `GANTT_STAGE_FACTOR` * pp) and rounded down to a multiple of
    pp (interleaving needs one) when m is at least pp."""
    cap = max(GANTT_MIN_MICROBATCHES, GANTT_STAGE_FACTOR * num_stages)
    shown = min(num_microbatches, cap)
    if shown >= num_stages:
        shown -= shown % num_stages
    return shown


def compare_schedules(plan: Plan) -> tuple[Timeline, ...]:
    """GPipe, 1F1B, interleaved 1F1B, zero bubble (ZB1P, ZB-V) and DualPipeV replayed with a
    pipelined plan's stages, stage times and (up to `gantt_microbatches`) micro-batches, a
    split backward's W half of it (`simulate_pipeline`'s default). The interleaved panel uses
    the plan's v, or `DEFAULT_INTERLEAVE` chunks per stage; a schedule whose blocks or
    micro-batches torch would refuse is left out."""
    p = plan.parallelism
    times = stage_times(plan)
    m = gantt_microbatches(plan.num_microbatches, p.pp)

    def run(schedule: Schedule, v: int = 1) -> Timeline:
        return simulate_pipeline(
            schedule,
            num_stages=p.pp,
            num_microbatches=m,
            forward_s=times.forward_s,
            backward_s=times.backward_s,
            virtual_stages=v,
        )

    out = [run(Schedule.GPIPE), run(Schedule.ONE_F_ONE_B)]
    v = p.virtual_stages if p.virtual_stages > 1 else DEFAULT_INTERLEAVE
    if p.pp * v <= plan.model.num_blocks and m % p.pp == 0:
        out.append(run(Schedule.INTERLEAVED_1F1B, v))
    # the split-backward schedules, where torch runs them (planner/cost/rules.py): ZB1P with
    # m a multiple of pp, the V schedules with two chunks per stage, DualPipeV with m >= 2 pp
    if m % p.pp == 0:
        out.append(run(Schedule.INTERLEAVED_ZB))
    if 2 * p.pp <= plan.model.num_blocks:
        out.append(run(Schedule.ZBV, 2))
        if m >= 2 * p.pp:
            out.append(run(Schedule.DUALPIPEV, 2))
    return tuple(out)
