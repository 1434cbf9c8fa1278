"""The schedules section of `paraplan compare`: a pipelined plan re-planned under each
pipeline schedule with every other dimension pinned (1F1B, interleaved 1F1B, ZB1P, ZB-V,
DualPipeV), so that predicted bubble, step time and peak memory compare like for like.

Five pinned evaluations, not searches: each dimension but the schedule (and its chunks per
stage) is the plan's, so each costs one evaluation of the cost model and its replay. A schedule
that does not fit or is not valid with the plan's degrees is returned with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..planner.cluster import Cluster
from ..planner.config import TrainConfig
from ..planner.model import ModelProfile
from ..planner.pins import Pins
from ..planner.plan import Plan
from ..planner.strategy import Schedule
from .colors import schedule_color
from .plots import _footnote, _new_figure, _title
from .strategies import Compared, _Planner
from .timeline import DEFAULT_INTERLEAVE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COMPARED_SCHEDULES = (
    Schedule.ONE_F_ONE_B,
    Schedule.INTERLEAVED_1F1B,
    Schedule.INTERLEAVED_ZB,
    Schedule.ZBV,
    Schedule.DUALPIPEV,
)
"""The schedules of the section, in table order."""
SCHEDULE_LABELS = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED_1F1B: "interleaved 1F1B",
    Schedule.INTERLEAVED_ZB: "zero bubble ZB1P",
    Schedule.ZBV: "ZB-V",
    Schedule.DUALPIPEV: "DualPipeV",
}
"""Human names for tables and legends."""
V_CHUNKS = 2
"""ZB-V and DualPipeV place two model chunks per stage (the V)."""


def schedule_virtual_stages(schedule: Schedule, plan: Plan) -> int:
    """Chunks per stage a schedule is compared with: 1 for 1F1B and ZB1P (Qi et al.'s ZB-H1,
    one chunk per stage), the plan's v (or `DEFAULT_INTERLEAVE` when the plan does not
    interleave) for interleaved 1F1B, two for the V schedules."""
    if schedule in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_ZB):
        return 1
    if schedule in (Schedule.ZBV, Schedule.DUALPIPEV):
        return V_CHUNKS
    v = plan.parallelism.virtual_stages
    return v if v > 1 else DEFAULT_INTERLEAVE


def schedule_name(schedule: Schedule) -> str:
    """The `Compared.name` of a schedule's row: ``schedule-<value>``."""
    return f"schedule-{schedule}"


def compare_pinned_schedules(
    plan: Plan, profile: ModelProfile, cluster: Cluster, train: TrainConfig
) -> tuple[Compared, ...]:
    """Each of `COMPARED_SCHEDULES` with the plan's other dimensions pinned, in that order
    (ValueError when the plan has no pipeline)."""
    if plan.parallelism.pp < 2:
        raise ValueError(
            f"the plan has pp={plan.parallelism.pp}: no pipeline schedules to compare; "
            "use a plan with pp >= 2"
        )
    planner = _Planner(profile, cluster, train)
    base = Pins.of(plan.strategy())
    out = []
    for schedule in COMPARED_SCHEDULES:
        v = schedule_virtual_stages(schedule, plan)
        pins = replace(base, schedule=schedule, virtual_stages=v)
        out.append(planner.run(schedule_name(schedule), SCHEDULE_LABELS[schedule], pins))
    return tuple(out)


GIB = 2**30
"""Bytes per GiB on the memory panel."""
PANELS = (
    ("pipeline bubble (%)", "bubble_fraction", 100.0),
    ("step time (s)", "step_time_s", 1.0),
    ("peak memory per GPU (GiB)", "memory_per_gpu_bytes", 1.0 / GIB),
)
"""The figure's panels: heading, `Plan.predicted` attribute, scale."""


def _schedule_of(e: Compared) -> Schedule:
    return Schedule(e.name.removeprefix("schedule-"))


def schedules_figure(rows: Sequence[Compared], *, context: str, source: str) -> Figure:
    """Predicted bubble, step time and peak memory per GPU of each schedule's pinned plan
    (`compare_pinned_schedules`), one panel each, bars in the schedule's Gantt colour; a
    schedule without a fitting plan is named with its status instead of a bar."""
    if not rows:
        raise ValueError("no schedules to plot; give at least one compare_pinned_schedules row")
    fig = _new_figure(11, 4.2)
    axes = fig.subplots(1, len(PANELS))
    for ax, (heading, attr, scale) in zip(axes, PANELS, strict=True):
        for x, e in enumerate(rows):
            color = schedule_color(str(_schedule_of(e)))
            if e.plan is None or not e.fits:
                ax.text(x, 0.0, str(e.status), rotation=90, ha="center", va="bottom", color=color)
                continue
            value = getattr(e.plan.predicted, attr) * scale
            ax.bar(x, value, color=color)
            ax.text(x, value, f"{value:.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)), [e.label for e in rows], rotation=30, ha="right")
        ax.set_ylabel(heading)
        ax.set_xlabel("schedule")
    what = "Pipeline schedules with the plan's other dimensions pinned"
    fig.suptitle(_title(what, context), fontsize=10)
    _footnote(fig, source)
    return fig
