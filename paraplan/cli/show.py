"""`paraplan show PLAN`: print a saved plan's table, as `paraplan plan` printed it.

Exit status: 0; 2 when the file is missing or not a valid plan.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_OK


def add_parser(subparsers: Any) -> None:
    """Add the `show` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "show",
        help="print a saved plan's table",
        description="Print a saved plan: layout, predicted time and memory, the runners-up.",
    )
    p.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan show` on parsed arguments; prints, returns the exit status."""
    from ..planner.explain import format_plan
    from ..planner.plan_io import load_plan

    print(format_plan(load_plan(args.plan)))
    return EXIT_OK
