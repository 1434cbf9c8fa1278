"""Reports comparing strategies (`paraplan compare`): named alternatives planned by the search,
a pipeline schedule replay, figures, and the Markdown/HTML report.

Importing this package loads no plotting library: matplotlib is imported by the functions that
draw (`plots`), inside them.
"""

from ..planner.solvers.pipeline_replay import Interval, Phase, Timeline, simulate_pipeline
from .compose import (
    DEFAULT_TRADEOFF,
    TRADEOFF_STRATEGIES,
    ReportOptions,
    ReportResult,
    build_report,
    parse_tradeoff,
    report_step_count,
)
from .strategies import STRATEGY_NAMES, Compared, Status, compare_strategies, parse_strategies
from .timeline import compare_schedules

__all__ = [
    "DEFAULT_TRADEOFF",
    "STRATEGY_NAMES",
    "TRADEOFF_STRATEGIES",
    "Compared",
    "Interval",
    "Phase",
    "ReportOptions",
    "ReportResult",
    "Status",
    "Timeline",
    "build_report",
    "compare_schedules",
    "compare_strategies",
    "parse_strategies",
    "parse_tradeoff",
    "report_step_count",
    "simulate_pipeline",
]
