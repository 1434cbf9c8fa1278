"""The report as text: README.md (Markdown, figures linked) and report.html (one self-contained
page: figures embedded as base64 data URIs, no script, no network).

Every number cell of the HTML table carries ``data-strategy`` (the plan file's name),
``data-field`` (its path in the plan JSON, e.g. ``predicted.step_time_s``), ``data-column`` (its
heading: a per-GPU column shows the value over ``cluster.num_gpus``) and ``data-value`` (the
exact float, ``repr``), so that a reader or a test can check the table against
``plans/<strategy>.json``.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import Any

from ..planner.plan import Plan
from ..planner.units import figure
from .colors import strategy_color
from .strategies import Compared

GB = 2**30
"""Bytes per GiB in the table (2^30, as `paraplan plan` prints)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """A number column of the strategy table."""

    header: str
    """Column heading, with its unit."""
    field: str
    """Dotted path of the value in the plan JSON."""
    scale: float
    """Display value = JSON value * scale."""
    decimals: int
    """Decimals of the displayed value (more, to three significant digits, where these
    would show fewer than two: a CPU plan's 0.00912 s step, `planner.units.figure`)."""
    per_gpu: bool = False
    """Display the value over the plan's GPU count (``cluster.num_gpus``), e.g. tokens/s."""

    def shown(self, data: dict[str, Any]) -> str:
        """The cell's text for a plan JSON dict (``-`` for a figure the plan does not record:
        a plan written before it existed)."""
        value = field_value(data, self.field)
        if value is None:
            return "-"
        if self.per_gpu:
            value = value / data["cluster"]["num_gpus"]
        return self.text(value * self.scale)

    def text(self, shown: float) -> str:
        """A displayed value (the JSON value already scaled) as the table writes it."""
        return figure(shown, self.decimals)


COLUMNS = (
    Column(header="step time (s)", field="predicted.step_time_s", scale=1.0, decimals=3),
    Column(header="tokens/s", field="predicted.tokens_per_s", scale=1.0, decimals=0),
    Column(
        header="tokens/s per GPU",
        field="predicted.tokens_per_s",
        scale=1.0,
        decimals=0,
        per_gpu=True,
    ),
    Column(header="MFU (%)", field="predicted.mfu", scale=100.0, decimals=1),
    Column(
        header="TFLOP/s per GPU",
        field="predicted.model_flops_per_s_per_gpu",
        scale=1e-12,
        decimals=1,
    ),
    Column(
        header="memory per GPU (GiB)",
        field="predicted.memory_per_gpu_bytes",
        scale=1 / GB,
        decimals=2,
    ),
    Column(
        header="usable per GPU (GiB)",
        field="predicted.memory_capacity_bytes",
        scale=1 / GB,
        decimals=2,
    ),
    Column(header="bubble (%)", field="predicted.bubble_fraction", scale=100.0, decimals=1),
    Column(header="exposed comm (s)", field="predicted.exposed_comm_s", scale=1.0, decimals=3),
)
"""The numbers the table shows for each strategy, read from its plan JSON."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FigureEntry:
    """One figure of the report."""

    key: str
    """Short name (memory, time, gantt, tradeoff); also the ``data-figure`` attribute."""
    heading: str
    """Section heading."""
    caption: str
    """What it shows and from which data."""
    png_path: str
    """Path of the PNG relative to the report folder."""
    svg_path: str
    """Path of the SVG relative to the report folder."""
    png_bytes: bytes
    """The PNG itself, embedded in the HTML."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportContent:
    """Everything the report says."""

    title: str
    """Page title."""
    context: str
    """Model, cluster and training configuration in one line."""
    entries: tuple[Compared, ...]
    """The compared strategies, in table order."""
    figures: tuple[FigureEntry, ...]
    """The figures, in page order."""
    notes: tuple[str, ...]
    """Remarks (figures left out and why, model source notes)."""
    generator: str
    """Tool and version."""
    schedules: tuple[Compared, ...] = ()
    """The pipelined plan under each schedule, other dimensions pinned (report/schedules.py);
    empty when no compared strategy has a pipeline."""
    schedules_of: str = ""
    """The label of the strategy whose other dimensions the schedules pin."""


SCHEDULE_COLUMNS = (
    Column(header="step time (s)", field="predicted.step_time_s", scale=1.0, decimals=3),
    Column(header="bubble (%)", field="predicted.bubble_fraction", scale=100.0, decimals=1),
    Column(
        header="memory per GPU (GiB)",
        field="predicted.memory_per_gpu_bytes",
        scale=1 / GB,
        decimals=2,
    ),
)
"""The numbers the schedules table shows for each schedule, read from its plan JSON."""


def plan_path(name: str) -> str:
    """Where a strategy's plan JSON lies in the report folder."""
    return f"plans/{name}.json"


def schedule_plan_path(name: str) -> str:
    """Where a schedule row's plan JSON lies in the report folder (``schedule-zbv`` ->
    ``schedules/zbv.json``), apart from the strategies' plans/."""
    return f"schedules/{name.removeprefix('schedule-')}.json"


def field_value(data: dict[str, Any], field: str) -> Any:
    """The value at a dotted path of a plan JSON dict."""
    value: Any = data
    for key in field.split("."):
        value = value[key]
    return value


def layout_summary(plan: Plan) -> str:
    """The plan's layout in one line (`Plan.short`), e.g.
    ``dp=4 tp=1 pp=1 cp=2 zero=3 mbs=1 m=64 rc=none``."""
    return plan.short()


def status_text(e: Compared) -> str:
    """What the table says for a strategy without fitting numbers."""
    need = (
        f" (needs at least {e.least_memory_bytes / GB:.2f} GiB per GPU)"
        if e.least_memory_bytes is not None
        else ""
    )
    return f"{e.status}{need}: {e.reason}"


# ---- Markdown ------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(content: ReportContent) -> str:
    """README.md of the report."""
    lines = [f"# {content.title}", "", content.context + ".", ""]
    lines += [
        "Predictions of paraplan's cost model. Each strategy's plan is in `plans/<name>.json`; "
        "the table's numbers are read from those files. "
        f"Interactive page: [report.html](report.html). Written by {content.generator}.",
        "",
        "## Strategies",
        "",
        "| strategy | layout | " + " | ".join(c.header for c in COLUMNS) + " | plan |",
        "|---|---|" + "---:|" * len(COLUMNS) + "---|",
    ]
    for e in content.entries:
        link = f"[{plan_path(e.name)}]({plan_path(e.name)})" if e.plan is not None else "-"
        if e.fits and e.plan is not None:
            data = e.plan.to_dict()
            cells = [c.shown(data) for c in COLUMNS]
            row = [e.label, layout_summary(e.plan), *cells, link]
        else:
            row = [e.label, _md_cell(status_text(e)), *["-"] * len(COLUMNS), link]
        lines.append("| " + " | ".join(_md_cell(x) for x in row) + " |")
    lines += ["", "How each strategy was planned (pinned dimensions; the rest searched):", ""]
    for e in content.entries:
        lines.append(
            f"- **{e.label}** (`{e.name}`): "
            + (f"`--fix {e.pins}`" if e.pins else "nothing pinned")
        )
    lines += _markdown_schedules(content)
    for fig in content.figures:
        lines += ["", f"## {fig.heading}", "", f"![{fig.heading}]({fig.png_path})", ""]
        lines.append(f"{fig.caption} (vector: [{fig.svg_path}]({fig.svg_path}))")
    if content.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in content.notes]
    return "\n".join(lines) + "\n"


def _markdown_schedules(content: ReportContent) -> list[str]:
    """The schedules table (none when no strategy has a pipeline)."""
    if not content.schedules:
        return []
    lines = [
        "",
        "## Pipeline schedules compared",
        "",
        f"The pipeline of {content.schedules_of} under each schedule, its other dimensions "
        "pinned (the per-layer recomputation is re-chosen for each).",
        "",
        "| schedule | layout | " + " | ".join(c.header for c in SCHEDULE_COLUMNS) + " | plan |",
        "|---|---|" + "---:|" * len(SCHEDULE_COLUMNS) + "---|",
    ]
    for e in content.schedules:
        link = (
            f"[{schedule_plan_path(e.name)}]({schedule_plan_path(e.name)})"
            if e.plan is not None
            else "-"
        )
        if e.fits and e.plan is not None:
            data = e.plan.to_dict()
            cells = [c.shown(data) for c in SCHEDULE_COLUMNS]
            row = [e.label, layout_summary(e.plan), *cells, link]
        else:
            row = [e.label, _md_cell(status_text(e)), *["-"] * len(SCHEDULE_COLUMNS), link]
        lines.append("| " + " | ".join(_md_cell(x) for x in row) + " |")
    return lines


# ---- HTML ----------------------------------------------------------------------------------
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
thead th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.nofit { color: #a33; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em;
          border: 1px solid #333; vertical-align: middle; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
code { font-size: 0.9em; }
td.pins { max-width: 20em; }
"""


def _h(text: object) -> str:
    return html.escape(str(text), quote=True)


def _html_row(e: Compared) -> str:
    color = strategy_color(e.name)
    head = (
        f'<th scope="row"><span class="swatch" style="background:{color}"></span>{_h(e.label)}</th>'
    )
    link = (
        f'<a href="{_h(plan_path(e.name))}">{_h(plan_path(e.name))}</a>'
        if e.plan is not None
        else "-"
    )
    if e.fits and e.plan is not None:
        data = e.plan.to_dict()
        cells = [f"<td>{_h(layout_summary(e.plan))}</td>"]
        for c in COLUMNS:
            value = field_value(data, c.field)
            exact = "" if value is None else f' data-value="{_h(repr(float(value)))}"'
            cells.append(
                f'<td class="num" data-strategy="{_h(e.name)}" data-field="{_h(c.field)}" '
                f'data-column="{_h(c.header)}"{exact}>{_h(c.shown(data))}</td>'
            )
    else:
        need = (
            f' data-min-memory-bytes="{_h(repr(float(e.least_memory_bytes)))}"'
            if e.least_memory_bytes is not None
            else ""
        )
        cells = [
            f'<td class="nofit" colspan="{len(COLUMNS) + 1}" data-status="{_h(e.status)}"'
            f"{need}>{_h(status_text(e))}</td>"
        ]
    # Pins in --fix form, breakable after each comma (<wbr>) without changing what is copied.
    pins = ",<wbr>".join(_h(p) for p in e.pins.split(",")) if e.pins else "nothing pinned"
    return (
        f'<tr data-strategy="{_h(e.name)}">{head}{"".join(cells)}<td>{link}</td>'
        f'<td class="pins"><code>{pins}</code></td></tr>'
    )


def _html_figure(fig: FigureEntry) -> str:
    data = base64.b64encode(fig.png_bytes).decode("ascii")
    return (
        f'<section id="{_h(fig.key)}"><h2>{_h(fig.heading)}</h2><figure>'
        f'<img data-figure="{_h(fig.key)}" alt="{_h(fig.heading)}" '
        f'src="data:image/png;base64,{data}">'
        f'<figcaption>{_h(fig.caption)} (files: <a href="{_h(fig.png_path)}">'
        f'{_h(fig.png_path)}</a>, <a href="{_h(fig.svg_path)}">{_h(fig.svg_path)}</a>)'
        "</figcaption></figure></section>"
    )


def _html_schedules(content: ReportContent) -> str:
    """The schedules table ('' when no strategy has a pipeline)."""
    if not content.schedules:
        return ""
    rows = []
    for e in content.schedules:
        link = (
            f'<a href="{_h(schedule_plan_path(e.name))}">{_h(schedule_plan_path(e.name))}</a>'
            if e.plan is not None
            else "-"
        )
        if e.fits and e.plan is not None:
            data = e.plan.to_dict()
            cells = [f"<td>{_h(layout_summary(e.plan))}</td>"]
            for c in SCHEDULE_COLUMNS:
                value = field_value(data, c.field)
                cells.append(
                    f'<td class="num" data-schedule="{_h(e.name)}" data-field="{_h(c.field)}" '
                    f'data-schedule-value="{_h(repr(float(value)))}">'
                    f"{_h(c.shown(data))}</td>"
                )
        else:
            cells = [
                f'<td class="nofit" colspan="{len(SCHEDULE_COLUMNS) + 1}" '
                f'data-status="{_h(e.status)}">{_h(status_text(e))}</td>'
            ]
        rows.append(
            f'<tr data-schedule="{_h(e.name)}"><th scope="row">{_h(e.label)}</th>'
            f"{''.join(cells)}<td>{link}</td></tr>"
        )
    head = "".join(f"<th>{_h(c.header)}</th>" for c in SCHEDULE_COLUMNS)
    return (
        '<section id="schedules"><h2>Pipeline schedules compared</h2>'
        f"<p>The pipeline of {_h(content.schedules_of)} under each schedule, its other "
        "dimensions pinned (the per-layer recomputation is re-chosen for each).</p>"
        f'<table id="schedule-table"><thead><tr><th>schedule</th><th>layout</th>{head}'
        f"<th>plan</th></tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table></section>"
    )


def render_html(content: ReportContent) -> str:
    """report.html: the whole report in one file."""
    head_cells = "".join(f"<th>{_h(c.header)}</th>" for c in COLUMNS)
    rows = "\n".join(_html_row(e) for e in content.entries)
    notes = "".join(f"<li>{_h(n)}</li>" for n in content.notes)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_h(content.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_h(content.title)}</h1>",
        f'<p class="context">{_h(content.context)}.</p>',
        "<p>Predictions of paraplan's cost model; each strategy's plan is in "
        "<code>plans/&lt;name&gt;.json</code> and the table's numbers are read from those "
        f"files. Written by {_h(content.generator)}.</p>",
        '<h2>Strategies</h2><table id="strategies"><thead><tr><th>strategy</th>'
        f"<th>layout</th>{head_cells}<th>plan</th><th>pinned</th></tr></thead>",
        f"<tbody>\n{rows}\n</tbody></table>",
        _html_schedules(content),
        *(_html_figure(f) for f in content.figures),
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
