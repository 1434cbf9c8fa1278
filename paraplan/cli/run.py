"""`paraplan run PLAN -- SCRIPT [ARGS]`: launch a training script under torchrun with one
process per planned device; the script finds the plan in the PARAPLAN_PLAN environment
variable.

Exit status: torchrun's; 2 on bad input (missing plan or script, a multi-node plan).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Add the `run` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "run",
        help="launch a training script under torchrun with the plan's world size",
        description="paraplan run plan.json -- train.py [args]: one process per planned device; "
        "the script finds the plan in the PARAPLAN_PLAN environment variable.",
    )
    p.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    p.add_argument(
        "script",
        nargs=argparse.REMAINDER,
        metavar="-- SCRIPT [ARGS]",
        help="the training script and its arguments, after --",
    )
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan run` on parsed arguments; returns torchrun's exit status."""
    from ..executor.launch import run_plan

    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        raise ValueError("no training script: use paraplan run plan.json -- train.py [args]")
    return run_plan(args.plan, script[0], script[1:])
