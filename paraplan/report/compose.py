"""`paraplan compare` end to end: plan the strategies, draw the figures, write the report.

The report folder holds README.md, report.html (self-contained), plans/<name>.json (one plan
per compared strategy), schedules/<schedule>.json (the first pipelined strategy re-planned
under each pipeline schedule, report/schedules.py), figures/<key>.png and .svg, and
data/*.json (the trade-off curves and the replayed schedules the figures draw). It is built in
a temporary folder next to the target and moved into place at the end, so a reader never sees
a half-written report; an existing report in the target is replaced, any other non-empty folder
is left alone (ValueError).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..planner.build import GENERATOR
from ..planner.cluster import Cluster
from ..planner.config import TrainConfig
from ..planner.jsonio import to_json, write_atomic
from ..planner.model import ModelProfile, attention_windows, windows_text
from ..planner.plan import Plan
from ..planner.plan_io import save_plan
from ..planner.solvers.chain import LayerChain
from . import plots
from .render import (
    FigureEntry,
    ReportContent,
    plan_path,
    render_html,
    render_markdown,
    schedule_plan_path,
)
from .schedules import compare_pinned_schedules, schedules_figure
from .strategies import STRATEGY_NAMES, Compared, compare_strategies, step_count
from .timeline import compare_schedules, gantt_microbatches

TRADEOFF_STRATEGIES = ("store-all", "sqrt-L", "full-recompute", "paraplan-dp", "paraplan-ilp")
"""Checkpointing strategies `--tradeoff` accepts (planner/solvers/tradeoff.py STRATEGIES)."""
DEFAULT_TRADEOFF = ("store-all", "sqrt-L", "full-recompute", "paraplan-dp")
"""Drawn by default. The ILP is left out: on a 34-layer chain (llama3-8b) it takes 10-25 s
per budget with PuLP and the default solver, against well under a second for all the rest
(measured on 2 CPU cores); the DP is optimal on chains anyway."""
DEFAULT_TRADEOFF_BUDGETS = 8
"""Memory budgets per trade-off curve."""
DEFAULT_ILP_TIME_LIMIT_S = 10.0
"""Solver time limit per budget when the ILP is drawn."""
REPORT_MARKER = "report.html"
"""A folder holding this file is a report `build_report` may replace."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportOptions:
    """What to compare and draw."""

    strategies: tuple[str, ...] = STRATEGY_NAMES
    """Strategies to compare (`strategies.STRATEGY_NAMES`), in table order."""
    top_k: int = 3
    """Runners-up of the plan to compare."""
    tradeoff: tuple[str, ...] = DEFAULT_TRADEOFF
    """Checkpointing strategies of the trade-off figure (empty: no figure)."""
    tradeoff_budgets: int = DEFAULT_TRADEOFF_BUDGETS
    """Memory budgets per trade-off curve."""
    ilp_time_limit_s: float = DEFAULT_ILP_TIME_LIMIT_S
    """ILP time limit per budget (with ``paraplan-ilp``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportResult:
    """What `build_report` wrote."""

    folder: Path
    """The report folder."""
    entries: tuple[Compared, ...]
    """The compared strategies, in table order."""
    files: tuple[str, ...]
    """Every file written, relative to `folder`, sorted."""
    notes: tuple[str, ...]
    """The report's notes (figures left out and why)."""


def parse_tradeoff(text: str) -> tuple[str, ...]:
    """`--tradeoff`: a comma list of `TRADEOFF_STRATEGIES`, or ``none``."""
    if text.strip().lower() == "none":
        return ()
    names: list[str] = []
    lowered = {s.lower(): s for s in TRADEOFF_STRATEGIES}
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if raw.lower() not in lowered:
            raise ValueError(
                f"--tradeoff: unknown strategy {raw!r}; use a comma list of "
                f"{', '.join(TRADEOFF_STRATEGIES)}, or none"
            )
        if lowered[raw.lower()] not in names:
            names.append(lowered[raw.lower()])
    if not names:
        raise ValueError(f"--tradeoff is empty; use {', '.join(TRADEOFF_STRATEGIES)} or none")
    return tuple(names)


def report_step_count(options: ReportOptions) -> int:
    """Steps `build_report` reports to `on_step`: planning, trade-off curves, figures."""
    return step_count(options.strategies, options.top_k) + 2


def context_of(profile: ModelProfile, cluster: Cluster, train: TrainConfig) -> str:
    """Model, cluster and training configuration in one line (figure titles, report top)."""
    windows = windows_text(attention_windows(profile))
    return (
        f"{profile.name} on {cluster.name} ({cluster.num_gpus} x {cluster.accelerator.name}), "
        f"global batch {train.global_batch} x {train.seq_len} tokens, {train.precision}, "
        f"{train.optimizer}" + (f"; {windows}" if windows else "")
    )


def _check_target(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"-o {str(folder)!r} is a file; give a folder for the report")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / REPORT_MARKER).is_file():
        raise ValueError(
            f"-o {str(folder)!r} is a non-empty folder without a {REPORT_MARKER}; not replacing "
            "it: give a new or empty folder (or one holding an earlier report)"
        )


def _publish(built: Path, folder: Path) -> None:
    """Move the finished report into place, replacing an earlier report."""
    if not folder.exists():
        built.rename(folder)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
    old.rmdir()
    folder.rename(old)
    try:
        built.rename(folder)
    except BaseException:
        old.rename(folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _pipelined(entries: Sequence[Compared]) -> Compared | None:
    """The first fitting strategy with a pipeline (its stages drive the Gantt chart)."""
    return next((e for e in entries if e.fits and e.plan and e.plan.parallelism.pp > 1), None)


def _tradeoff_chain(profile: ModelProfile, cluster: Cluster, train: TrainConfig) -> LayerChain:
    """One sequence through the whole model on one GPU: measured layer times when the profile
    was measured on this accelerator, else FLOPs at its achievable matmul rate."""
    from ..planner.solvers import chain_from_profile

    acc = cluster.accelerator
    measured = profile.measured_on == acc.name
    spf = (
        None
        if measured
        else 1.0 / (acc.peak_flops_for(train.compute_dtype) * acc.matmul_efficiency)
    )
    return chain_from_profile(profile, micro_batch_size=1, seconds_per_flop=spf)


def build_report(
    folder: str | Path,
    *,
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    options: ReportOptions | None = None,
    notes: Sequence[str] = (),
    on_step: Callable[[str], None] | None = None,
) -> ReportResult:
    """Compare the strategies and write the report into `folder` (see the module docstring).
    `notes` are added to the report's notes; `on_step(label)` is called after each step
    (`report_step_count`). Raises ValueError on bad input; a strategy that does not fit is a
    row of the report, not an error."""
    opts = options or ReportOptions()
    target = Path(folder)
    _check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)

    def step(label: str) -> None:
        if on_step is not None:
            on_step(label)

    entries = compare_strategies(
        profile, cluster, train, names=opts.strategies, top_k=opts.top_k, on_step=on_step
    )
    context = context_of(profile, cluster, train)
    all_notes = list(notes)
    built = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        built.chmod(0o777 & ~umask)  # mkdtemp makes 0700; give the folder normal permissions
        for sub in ("plans", "schedules", "figures", "data"):
            (built / sub).mkdir()
        for e in entries:
            if e.plan is not None:
                save_plan(e.plan, built / plan_path(e.name))
        curves = _tradeoff(profile, cluster, train, opts, built, all_notes)
        step("trade-off curves")
        figures = _figures(entries, curves, profile, cluster, train, context, built, all_notes)
        piped = _pipelined(entries)
        schedules: tuple[Compared, ...] = ()
        if piped is not None and piped.plan is not None:
            schedules = compare_pinned_schedules(piped.plan, profile, cluster, train)
            figures.append(_schedules_section(piped, schedules, context, built))
        step("figures")
        content = ReportContent(
            title=f"paraplan compare: {profile.name} on {cluster.name}",
            context=context,
            entries=entries,
            figures=tuple(figures),
            notes=tuple(all_notes),
            generator=GENERATOR,
            schedules=schedules,
            schedules_of=piped.label if piped is not None else "",
        )
        write_atomic(built / "README.md", render_markdown(content))
        write_atomic(built / REPORT_MARKER, render_html(content))
        files = tuple(sorted(str(p.relative_to(built)) for p in built.rglob("*") if p.is_file()))
        _publish(built, target)
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        raise
    return ReportResult(folder=target, entries=entries, files=files, notes=tuple(all_notes))


def _tradeoff(
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    opts: ReportOptions,
    built: Path,
    notes: list[str],
) -> tuple | None:
    """The trade-off curves (also written to data/tradeoff.json), or None with a note."""
    if not opts.tradeoff:
        notes.append("No checkpointing trade-off figure: --tradeoff none.")
        return None
    from ..planner.solvers.tradeoff import default_budgets, tradeoff_curves

    chain = _tradeoff_chain(profile, cluster, train)
    try:
        budgets = default_budgets(chain, n=opts.tradeoff_budgets)
        curves = tradeoff_curves(
            chain,
            budgets,
            strategies=opts.tradeoff,
            pcie_bytes_per_s=cluster.accelerator.pcie_bw_bytes_per_s,
            ilp_time_limit_s=opts.ilp_time_limit_s,
        )
    except (ValueError, RuntimeError) as exc:
        notes.append(f"No checkpointing trade-off figure: {exc}")
        return None
    if "paraplan-ilp" not in opts.tradeoff:
        notes.append(
            "The trade-off figure leaves out paraplan-ilp by default (tens of seconds per budget "
            "on a chain of this size); add it with --tradeoff "
            + ",".join((*opts.tradeoff, "paraplan-ilp"))
            + "."
        )
    data = {"chain": chain.name, "budgets_bytes": budgets, "curves": to_json(curves)}
    write_atomic(built / "data" / "tradeoff.json", json.dumps(data, indent=2) + "\n")
    return curves


@dataclass(frozen=True, kw_only=True, slots=True)
class _Drawn:
    """A drawn figure before it is saved."""

    key: str
    heading: str
    caption: str
    figure: Any


def _figures(
    entries: Sequence[Compared],
    curves: tuple | None,
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    context: str,
    built: Path,
    notes: list[str],
) -> list[FigureEntry]:
    """Draw and save every figure into figures/; returns them in page order."""
    planned = ", ".join(plan_path(e.name) for e in entries if e.plan is not None) or "no plan"
    drawn = [
        _Drawn(
            key="memory",
            heading="Memory per GPU",
            caption="Peak memory per GPU of each strategy, by holder (predicted.memory_breakdown "
            "of each plan), against the usable memory (device memory less the headroom).",
            figure=plots.memory_figure(
                entries, context=context, source=f"{planned} (predicted.memory_breakdown)"
            ),
        ),
        _Drawn(
            key="time",
            heading="Time per step",
            caption="Step time of each fitting strategy on its bounding pipeline stage "
            "(predicted.time_breakdown): compute, recompute, exposed communication, pipeline "
            "bubble, optimizer step.",
            figure=plots.time_figure(
                entries, context=context, source=f"{planned} (predicted.time_breakdown)"
            ),
        ),
    ]
    gantt = _gantt(entries, context, built, notes)
    if gantt is not None:
        drawn.append(gantt)
    if curves is not None:
        drawn.append(_tradeoff_figure(curves, profile, cluster, train, context))
    return [_save(d, built) for d in drawn]


def _save(d: _Drawn, built: Path) -> FigureEntry:
    """Save a drawn figure into figures/."""
    png, svg = plots.save_figure(d.figure, built / "figures", d.key)
    return FigureEntry(
        key=d.key,
        heading=d.heading,
        caption=d.caption,
        png_path=f"figures/{png.name}",
        svg_path=f"figures/{svg.name}",
        png_bytes=png.read_bytes(),
    )


def _schedules_section(
    piped: Compared, rows: Sequence[Compared], context: str, built: Path
) -> FigureEntry:
    """The pinned schedules of the pipelined strategy: their plans in plans/, their numbers in
    data/schedule_compare.json, and the figure."""
    for e in rows:
        if e.plan is not None:
            save_plan(e.plan, built / schedule_plan_path(e.name))
    data = {
        "pinned_from": plan_path(piped.name),
        "schedules": [
            {
                "name": e.name,
                "status": str(e.status),
                "reason": e.reason,
                "plan": schedule_plan_path(e.name),
            }
            for e in rows
        ],
    }
    write_atomic(built / "data" / "schedule_compare.json", json.dumps(data, indent=2) + "\n")
    planned = ", ".join(schedule_plan_path(e.name) for e in rows if e.plan is not None)
    drawn = _Drawn(
        key="schedule-compare",
        heading="Pipeline schedules: bubble, time, memory",
        caption=f"The pipeline of {piped.label} planned under each schedule with its other "
        "dimensions pinned: predicted bubble fraction, step time and peak memory per GPU "
        "(each schedule's Gantt chart is in the pipeline schedules figure).",
        figure=schedules_figure(
            rows, context=context, source=f"{planned or 'no plan'} (predicted)"
        ),
    )
    return _save(drawn, built)


def _gantt(
    entries: Sequence[Compared], context: str, built: Path, notes: list[str]
) -> _Drawn | None:
    """GPipe, 1F1B, interleaved and the zero-bubble schedules with the first pipelined
    strategy's stages (replays written to data/schedules.json), or None with a note."""
    piped = _pipelined(entries)
    if piped is None or piped.plan is None:
        notes.append(
            "No pipeline Gantt chart: no fitting compared strategy uses a pipeline "
            "(pp > 1); add megatron to --strategies."
        )
        return None
    plan: Plan = piped.plan
    timelines = compare_schedules(plan)
    data = {"label": piped.label, "plan": plan_path(piped.name), "timelines": to_json(timelines)}
    write_atomic(built / "data" / "schedules.json", json.dumps(data, indent=2) + "\n")
    shown = gantt_microbatches(plan.num_microbatches, plan.parallelism.pp)
    what = (
        f"Pipeline schedules with the stages of {piped.label} (pp={plan.parallelism.pp}, "
        f"{shown} of its {plan.num_microbatches} micro-batches shown)"
    )
    source = (
        f"{plan_path(piped.name)} (per-micro-batch stage time from "
        "predicted.time_breakdown.bubble_s), replayed in data/schedules.json"
    )
    return _Drawn(
        key="gantt",
        heading="Pipeline schedules",
        caption="GPipe, 1F1B, interleaved 1F1B and the zero-bubble schedules (ZB1P, ZB-V, "
        f"DualPipeV) replayed per stage over time with the stage times of {piped.label}; light "
        "bars are forwards, dark bars backwards (a split backward's input gradient B; its "
        "weight gradient W in ochre), numbers are micro-batches, hatched bars a stage's "
        "odd-numbered model chunks (the V schedules fold the chunks back: stage s holds "
        "chunks s and 2pp-1-s).",
        figure=plots.gantt_figure(timelines, what=what, context=context, source=source),
    )


def _tradeoff_figure(
    curves: tuple, profile: ModelProfile, cluster: Cluster, train: TrainConfig, context: str
) -> _Drawn:
    """The checkpointing trade-off curves."""
    what = (
        f"Activation checkpointing of one sequence ({train.seq_len} tokens, "
        f"{len(profile.layers)} layers, no TP) on one {cluster.accelerator.name}: time vs memory"
    )
    return _Drawn(
        key="tradeoff",
        heading="Checkpointing: time vs memory",
        caption="Time overhead over storing every activation at each memory budget, for each "
        "checkpointing strategy; every point is a schedule replayed by the solvers' simulator "
        "(filled: optimal or a fixed baseline, hollow: feasible, not proven optimal).",
        figure=plots.tradeoff_figure(
            curves,
            what=what,
            context=context,
            source="data/tradeoff.json (planner/solvers/tradeoff.py)",
        ),
    )
