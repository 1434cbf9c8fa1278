"""`paraplan run PLAN -- SCRIPT [ARGS]`: launch a training script under torchrun with one
process per planned device; the script finds the plan in the PARAPLAN_PLAN environment
variable.

Progress: on a terminal (and without --no-progress) the launch is announced on stderr and
`PARAPLAN_PROGRESS=1` tells the training script that it may draw a progress bar on rank 0 (the
examples draw one over the training steps); otherwise it is 0. The ranks' own output follows.

Exit status: torchrun's; 2 on bad input (missing plan or script, a multi-node plan).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .common import add_no_progress_arg, show_progress

PROGRESS_ENV = "PARAPLAN_PROGRESS"
"""Environment variable set for the launched ranks: 1 when a progress bar may be drawn (stderr
is a terminal and --no-progress was not given), else 0."""


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
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan run` on parsed arguments; returns torchrun's exit status."""
    from ..executor.launch import run_plan

    script = list(args.script)
    if script and script[0].startswith("-") and "--" in script:  # `PLAN --no-progress -- ...`
        own, script = script[: script.index("--")], script[script.index("--") :]
        unknown = [a for a in own if a != "--no-progress"]
        if unknown:
            raise ValueError(
                f"{' '.join(unknown)}: not an option of paraplan run (--no-progress is); put "
                "the training script's arguments after --"
            )
        args.no_progress = True
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        raise ValueError("no training script: use paraplan run plan.json -- train.py [args]")
    shown = show_progress(args)
    if shown:  # before the first step each rank imports torch and builds its model: seconds
        print(
            f"paraplan: launching {script[0]} under torchrun with {args.plan} (each rank "
            "imports torch and builds the model before its first step)",
            file=sys.stderr,
            flush=True,
        )
    before = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = "1" if shown else "0"  # the ranks inherit it (run_plan)
    try:
        return run_plan(args.plan, script[0], script[1:])
    finally:  # leave this process's environment as it was
        if before is None:
            del os.environ[PROGRESS_ENV]
        else:
            os.environ[PROGRESS_ENV] = before
