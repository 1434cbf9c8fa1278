"""The report's figures: memory and time breakdown bars, pipeline Gantt charts and
checkpointing trade-off curves.

Each function returns a matplotlib `Figure` built without pyplot (no global state, no display;
PNG and SVG through matplotlib's Agg and SVG canvases); matplotlib is imported inside the
functions, so importing the planner stays free of it. Every figure is titled with what it
shows and the model, cluster and batch it is for, labels its axes with units, and names its
source data in a footnote. Colours come from `colors`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..planner.cost.schedules import PENDING_W_ACT_FACTOR
from ..planner.solvers.pipeline_replay import Phase, Timeline
from .colors import WEIGHT_GRAD_COLOR, component_color, schedule_color, strategy_color
from .strategies import Compared

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GB = 2**30
"""Bytes per GiB: memory is shown in GiB (2^30 bytes), as `paraplan plan` prints it."""
MS_PER_S = 1e3
"""Gantt charts show milliseconds."""
PERCENT = 100.0
"""Overheads and fractions are shown in percent."""
PNG_DPI = 110
"""Resolution of the embedded PNGs (a 10-inch figure is 1100 pixels wide)."""
MIN_LABEL_SHARE = 0.025
"""A Gantt bar is labelled with its micro-batch when at least this share of the axis wide."""
TRADEOFF_MARKERS = {
    "store-all": ("s", 90),
    "sqrt-L": ("^", 70),
    "full-recompute": ("v", 70),
    "paraplan-dp": ("o", 36),
    "paraplan-ilp": ("D", 22),
}
"""(marker, size in points^2) per checkpointing strategy: baselines larger, so that a solver's
point on top of one leaves it visible."""
TITLE_WIDTH_CHARS = 110
"""Context lines of titles are wrapped at this many characters (long spec model names)."""
FORWARD_ALPHA = 0.45
"""Forwards are drawn as a light tint of the schedule's colour, backwards in full."""

MEMORY_PARTS = (
    ("params", "params_bytes", "parameters"),
    ("grads", "grads_bytes", "gradients"),
    ("optimizer", "optimizer_bytes", "optimizer states"),
    ("activations", "activations_bytes", "activations"),
    ("other", "other_bytes", "other (context, buffers)"),
)
"""(colour key, plan JSON predicted.memory_breakdown field, legend label)."""
TIME_PARTS = (
    ("compute", "compute_s", "compute"),
    ("recompute", "recompute_s", "recompute"),
    ("comm", "comm_s", "exposed communication"),
    ("bubble", "bubble_s", "pipeline bubble"),
    ("optimizer_step", "optimizer_s", "optimizer step"),
)
"""(colour key, plan JSON predicted.time_breakdown field, legend label)."""


class PointLike(Protocol):
    """A trade-off point (planner/solvers/tradeoff.py `TradeoffPoint`)."""

    @property
    def budget_bytes(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def overhead(self) -> float | None: ...


class CurveLike(Protocol):
    """A trade-off curve (planner/solvers/tradeoff.py `TradeoffCurve`)."""

    @property
    def strategy(self) -> str: ...
    @property
    def points(self) -> Sequence[PointLike]: ...


def _new_figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _footnote(fig: Figure, source: str) -> None:
    fig.supxlabel(f"source: {source}", fontsize=7, color="#555555", x=0.01, ha="left")


def _strategy_axis(ax: Axes, entries: Sequence[Compared]) -> None:
    """x ticks at each strategy, labelled in its colour."""
    ax.set_xticks(range(len(entries)), [e.label for e in entries], rotation=15, ha="right")
    for tick, e in zip(ax.get_xticklabels(), entries, strict=True):
        tick.set_color(strategy_color(e.name))
        tick.set_fontweight("bold")
    ax.set_xlabel("strategy")
    ax.set_xlim(-0.6, len(entries) - 0.4)


def _no_plan_note(ax: Axes, x: int, e: Compared, height: float) -> None:
    """Say "does not fit" / "not valid" on a strategy's bar (of `height`; 0: no bar)."""
    ax.text(
        x,
        height / 2 if height > 0 else 0.0,
        str(e.status),
        rotation=90,
        ha="center",
        va="center" if height > 0 else "bottom",
        fontsize=9,
        color=strategy_color(e.name),
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0},
    )


def _title(what: str, context: str) -> str:
    """A two-part title: what the figure shows, then the model, cluster and batch (wrapped)."""
    return "\n".join([what, *textwrap.wrap(context, TITLE_WIDTH_CHARS)])


def memory_figure(entries: Sequence[Compared], *, context: str, source: str) -> Figure:
    """Stacked peak memory per GPU of each strategy (plan JSON `predicted.memory_breakdown`),
    with the usable and the device memory as lines. A strategy that does not fit and has no
    plan shows the least memory it needs as a hatched bar."""
    if not entries:
        raise ValueError("no strategies to plot; give at least one")
    ref = next((e.plan for e in entries if e.plan is not None), None)
    fig = _new_figure(10, 5.2)
    ax = fig.add_subplot()
    for x, e in enumerate(entries):
        edge = strategy_color(e.name)
        if e.plan is not None:
            mb = e.plan.predicted.memory_breakdown
            bottom = 0.0
            for key, attr, _ in MEMORY_PARTS:
                value = getattr(mb, attr) / GB
                ax.bar(
                    x,
                    value,
                    bottom=bottom,
                    color=component_color(key),
                    edgecolor=edge,
                    linewidth=1.5,
                )
                bottom += value
            if not e.fits:
                _no_plan_note(ax, x, e, bottom)
        elif e.least_memory_bytes is not None:
            need = e.least_memory_bytes / GB
            ax.bar(x, need, color="white", edgecolor=edge, hatch="//", linewidth=1.5)
            _no_plan_note(ax, x, e, need)
        else:
            _no_plan_note(ax, x, e, 0.0)
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(color=component_color(k)) for k, _, _ in MEMORY_PARTS]
    labels = [lab for _, _, lab in MEMORY_PARTS]
    if ref is not None:
        usable = ref.predicted.memory_capacity_bytes / GB
        device = usable / (1.0 - ref.train.memory_headroom)
        handles.append(ax.axhline(usable, color="#CC3311", linewidth=1.5))
        labels.append(f"usable per GPU ({usable:.1f} GiB)")
        handles.append(ax.axhline(device, color="#555555", linewidth=1.0, linestyle=":"))
        labels.append(f"device memory ({device:.1f} GiB)")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    _strategy_axis(ax, entries)
    ax.set_ylabel("peak memory per GPU (GiB)")
    title = "Peak memory per GPU by strategy"
    if any(e.plan is None and e.least_memory_bytes is not None for e in entries):
        title += " (hatched: the least memory a strategy that does not fit needs)"
    ax.set_title(_title(title, context), fontsize=10)
    _footnote(fig, source)
    return fig


def time_figure(entries: Sequence[Compared], *, context: str, source: str) -> Figure:
    """Stacked step time of each strategy (plan JSON `predicted.time_breakdown`): compute,
    recompute, exposed communication, pipeline bubble, optimizer step."""
    if not entries:
        raise ValueError("no strategies to plot; give at least one")
    fig = _new_figure(10, 5.2)
    ax = fig.add_subplot()
    top = max((e.plan.predicted.step_time_s for e in entries if e.plan), default=1.0)
    for x, e in enumerate(entries):
        if e.plan is None or not e.fits:
            _no_plan_note(ax, x, e, 0.0)
            continue
        tb = e.plan.predicted.time_breakdown
        bottom = 0.0
        for key, attr, _ in TIME_PARTS:
            value = getattr(tb, attr)
            ax.bar(
                x,
                value,
                bottom=bottom,
                color=component_color(key),
                edgecolor=strategy_color(e.name),
                linewidth=1.5,
            )
            bottom += value
        ax.text(
            x,
            bottom + 0.01 * top,
            f"{e.plan.predicted.step_time_s:.2f} s",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color=component_color(k), label=lab) for k, _, lab in TIME_PARTS],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    _strategy_axis(ax, entries)
    ax.set_ylabel("time per step (s)")
    ax.set_ylim(0, top * 1.12)
    title = "Step time by strategy, on each plan's bounding pipeline stage"
    ax.set_title(_title(title, context), fontsize=10)
    _footnote(fig, source)
    return fig


def _schedule_name(t: Timeline) -> str:
    names = {
        "gpipe": "GPipe",
        "1f1b": "1F1B",
        "interleaved_1f1b": "interleaved 1F1B",
        "interleaved_zb": "zero bubble ZB1P",
        "zbv": "ZB-V",
        "dualpipev": "DualPipeV",
        "none": "no pipeline",
    }
    name = names[str(t.schedule)]
    return name + (f" (v={t.virtual_stages})" if t.virtual_stages > 1 else "")


def gantt_figure(timelines: Sequence[Timeline], *, what: str, context: str, source: str) -> Figure:
    """One panel per replayed schedule: pipeline stage on y (stage 0 on top), time in ms on x
    (shared), forwards light and backwards dark in the schedule's colour (a split backward's
    input gradient B dark, its weight gradient W in `WEIGHT_GRAD_COLOR`), micro-batch numbers
    on the bars that are wide enough; interleaved chunks after the first are hatched."""
    if not timelines:
        raise ValueError("no schedules to draw; give at least one Timeline")
    from matplotlib.patches import Patch

    n = len(timelines)
    pp = max(t.num_stages for t in timelines)
    fig = _new_figure(11, 0.9 + n * (0.45 * pp + 0.9))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    span_ms = max(t.makespan_s for t in timelines) * MS_PER_S
    for ax, t in zip(axes, timelines, strict=True):
        color = schedule_color(str(t.schedule))
        for x in t.intervals:
            left, width = x.start_s * MS_PER_S, x.duration_s * MS_PER_S
            forward = x.phase == Phase.FORWARD
            weight = x.phase == Phase.BACKWARD_WEIGHT
            local = x.chunk // t.num_stages
            ax.barh(
                x.stage,
                width,
                left=left,
                height=0.8,
                color=WEIGHT_GRAD_COLOR if weight else color,
                alpha=FORWARD_ALPHA if forward else 1.0,
                edgecolor="white",
                linewidth=0.5,
                hatch="//" if local % 2 else None,
            )
            if span_ms > 0 and width >= MIN_LABEL_SHARE * span_ms:
                ax.text(
                    left + width / 2,
                    x.stage,
                    str(x.microbatch),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if forward or weight else "white",
                )
        ax.set_yticks(range(t.num_stages), [str(s) for s in range(t.num_stages)])
        ax.set_ylim(t.num_stages - 0.5, -0.5)  # stage 0 on top
        ax.set_ylabel("pipeline stage")
        ax.set_xlabel("time (ms)")
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_title(
            f"{_schedule_name(t)}: {t.num_stages} stages, {t.num_microbatches} micro-batches, "
            f"makespan {t.makespan_s * MS_PER_S:,.1f} ms, bubble {t.bubble_fraction:.1%}, "
            f"stage 0 holds {t.in_flight(0, PENDING_W_ACT_FACTOR):.2g} micro-batches of "
            "activations at its peak",
            fontsize=9,
            color=color,
            loc="left",
        )
        split = any(x.phase == Phase.BACKWARD_WEIGHT for x in t.intervals)
        handles = [Patch(color=color, alpha=FORWARD_ALPHA, label="forward (F)")]
        if split:
            handles += [
                Patch(color=color, label="input gradient (B)"),
                Patch(color=WEIGHT_GRAD_COLOR, label="weight gradient (W)"),
            ]
        else:
            handles.append(Patch(color=color, label="backward"))
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=7,
        )
    axes[0].set_xlim(0, span_ms * 1.01 if span_ms > 0 else 1.0)
    fig.suptitle(_title(what, context), fontsize=10)
    _footnote(fig, source)
    return fig


def tradeoff_figure(curves: Sequence[CurveLike], *, what: str, context: str, source: str) -> Figure:
    """Time overhead over storing every activation against the memory budget, one line per
    checkpointing strategy (duck-typed planner/solvers/tradeoff.py `TradeoffCurve`s). Filled
    markers: proven optimal (or a fixed baseline that fits); hollow: feasible, optimality not
    proven. Budgets where a strategy has no schedule are left out of its line."""
    if not curves:
        raise ValueError("no trade-off curves to plot; give at least one")
    fig = _new_figure(10, 5.2)
    ax = fig.add_subplot()
    for curve in curves:
        color = strategy_color(curve.strategy)
        pts = [
            (p.budget_bytes / GB, p.overhead * PERCENT, p.status == "optimal")
            for p in curve.points
            if p.overhead is not None
        ]
        if not pts:
            ax.plot([], [], color=color, label=f"{curve.strategy} (fits no budget)")
            continue
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        marker, size = TRADEOFF_MARKERS.get(curve.strategy, ("o", 36))
        face = [color if p[2] else "white" for p in pts]
        ax.plot(xs, ys, color=color, linewidth=1.5)
        ax.scatter(
            xs, ys, c=face, edgecolors=color, zorder=3, s=size, marker=marker, label=curve.strategy
        )
    ax.set_xlabel("memory budget for activations (GiB)")
    ax.set_ylabel("time overhead vs store-all (%)")
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(_title(what, context), fontsize=10)
    _footnote(fig, source)
    return fig


def save_figure(fig: Figure, folder: str | Path, stem: str) -> tuple[Path, Path]:
    """Write `stem`.png and `stem`.svg into `folder`; returns their paths. The SVG carries no
    date, so the same report is written byte for byte the same."""
    target = Path(folder)
    png, svg = target / f"{stem}.png", target / f"{stem}.svg"
    meta: dict[str, Any] = {"Software": None}
    fig.savefig(png, dpi=PNG_DPI, metadata=meta)
    fig.savefig(svg, metadata={"Date": None})
    return png, svg
