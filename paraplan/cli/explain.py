"""`paraplan explain PLAN`: say in words what bounds a saved plan (memory, bubble,
communication) and what the next-best alternative costs.

Exit status: 0; 2 when the file is missing or not a valid plan.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_OK


def add_parser(subparsers: Any) -> None:
    """Add the `explain` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "explain",
        help="say in words what bounds a plan",
        description="What bounds the plan (memory, bubble, communication) and what the "
        "next-best alternative costs.",
    )
    p.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan explain` on parsed arguments; prints, returns the exit status."""
    from ..planner.explain import explain
    from ..planner.plan_io import load_plan

    print(explain(load_plan(args.plan)))
    return EXIT_OK
