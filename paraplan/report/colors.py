"""One colour per named thing, shared by every plot of a report.

A strategy keeps its colour in the memory bars, the time bars, the table and the trade-off
curves; a pipeline schedule keeps its colour in every Gantt panel; a memory or time component
keeps its colour in every stacked bar. Strategies and checkpointing policies take the
Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design", distinguishable with the common
colour-vision deficiencies), the plan's runners-up greys; schedules and components take Paul
Tol's "muted" and "light" schemes (Tol 2021, "Colour Schemes", SRON/EPS/TN/09-002), so that no
schedule or component is mistaken for a strategy. The same concept keeps the same colour across
families: the paraplan plan and paraplan's DP checkpointing are blue, DP + full recompute and
the full-recompute checkpointing policy are vermillion.
"""

from __future__ import annotations

import re

STRATEGY_COLORS: dict[str, str] = {
    # named alternatives of `paraplan compare` (see strategies.py)
    "plan": "#0072B2",  # Okabe-Ito blue
    "fsdp": "#E69F00",  # orange
    "megatron": "#009E73",  # bluish green
    "dp-recompute": "#D55E00",  # vermillion
    # checkpointing strategies of planner/solvers/tradeoff.py (STRATEGIES)
    "store-all": "#000000",  # black
    "sqrt-L": "#CC79A7",  # reddish purple
    "full-recompute": "#D55E00",  # vermillion: the same policy as dp-recompute
    "paraplan-dp": "#0072B2",  # blue: paraplan's own answer, as "plan"
    "paraplan-ilp": "#56B4E9",  # sky blue
}
"""Fixed colour of each strategy name."""

RUNNER_UP_COLORS = ("#333333", "#555555", "#777777", "#999999")
"""Colours of ``runner-up-1``, ``runner-up-2``, ... in rank order (the last repeats): greys,
dark to light, distinct from every named strategy."""

SCHEDULE_COLORS: dict[str, str] = {
    "none": "#DDDDDD",  # Tol pale grey
    "gpipe": "#882255",  # Tol muted wine
    "1f1b": "#117733",  # Tol muted green
    "interleaved_1f1b": "#332288",  # Tol muted indigo
    "interleaved_zb": "#44AA99",  # Tol muted teal
    "zbv": "#88CCEE",  # Tol muted cyan
    "dualpipev": "#CC6677",  # Tol muted rose
}
"""Fixed colour of each pipeline schedule (planner/strategy.py `Schedule` values)."""
WEIGHT_GRAD_COLOR = "#DDAA33"  # Tol bright yellow-ochre: no schedule's colour
"""The weight-gradient (W) boxes of the split-backward schedules, whatever the schedule."""

COMPONENT_COLORS: dict[str, str] = {
    # memory per GPU (plan JSON predicted.memory_breakdown)
    "params": "#77AADD",  # Tol light blue
    "grads": "#99DDFF",  # light cyan
    "optimizer": "#44BB99",  # mint
    "activations": "#EEDD88",  # light yellow
    "other": "#DDDDDD",  # pale grey
    # time per step (plan JSON predicted.time_breakdown)
    "compute": "#77AADD",
    "recompute": "#FFAABB",  # pink
    "comm": "#EE8866",  # orange
    "bubble": "#BBCC33",  # pear
    "optimizer_step": "#AAAA00",  # olive
}
"""Fixed colour of each memory or time component in the stacked bars."""

_RUNNER_UP = re.compile(r"runner-up-([1-9][0-9]*)")


def strategy_color(name: str) -> str:
    """The colour of a strategy name (``plan``, ``fsdp``, ``runner-up-2``, ``sqrt-L``, ...)."""
    if name in STRATEGY_COLORS:
        return STRATEGY_COLORS[name]
    match = _RUNNER_UP.fullmatch(name)
    if match:
        rank = int(match.group(1))
        return RUNNER_UP_COLORS[min(rank, len(RUNNER_UP_COLORS)) - 1]
    raise ValueError(
        f"no colour for strategy {name!r}; known names: {', '.join(STRATEGY_COLORS)} and "
        "runner-up-<rank>; add it to STRATEGY_COLORS in paraplan/report/colors.py"
    )


def schedule_color(schedule: str) -> str:
    """The colour of a pipeline schedule (``gpipe``, ``1f1b``, ``interleaved_1f1b``)."""
    if schedule not in SCHEDULE_COLORS:
        raise ValueError(
            f"no colour for schedule {schedule!r}; known: {', '.join(SCHEDULE_COLORS)}"
        )
    return SCHEDULE_COLORS[schedule]


def component_color(component: str) -> str:
    """The colour of a memory or time component (``params``, ``activations``, ``bubble``...)."""
    if component not in COMPONENT_COLORS:
        raise ValueError(
            f"no colour for component {component!r}; known: {', '.join(COMPONENT_COLORS)}"
        )
    return COMPONENT_COLORS[component]
