"""The `paraplan` command line: one module per command, sharing `common` (input arguments,
argument types, exit codes, error handling, progress bars).

Each command module has `add_parser(subparsers)`, which registers the command with its
`execute(args) -> int` as the handler; command modules never import each other. Torch,
matplotlib and the planner are imported inside the commands, so `paraplan --help` is fast.
Exit status: 0 on success, 2 on bad input or when nothing fits (see `common`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from . import calibrate, checkpoint, compare, explain, export, plan, profile, run, show
from .common import EXIT_BAD_INPUT, run_command

__all__ = ["EXIT_BAD_INPUT", "build_parser", "main"]

_COMMANDS = (plan, profile, explain, run, show, compare, checkpoint, calibrate, export)
"""Command modules in the order `paraplan --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The `paraplan` argument parser with every command."""
    parser = argparse.ArgumentParser(
        prog="paraplan",
        description="Plan how to parallelize the training of a large model, and why.",
    )
    parser.add_argument("--version", action="version", version=f"paraplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `paraplan` console script; returns the exit status. Called without
    `argv` (the console script, `python -m paraplan`), it is the process's last work: the
    process then ends at once, its output flushed, without the interpreter's finalization,
    which walked a large plan's search memos (about 0.2 s after the 1T GPT of issue 16). The
    `gc.freeze()` used for that before kept the frozen objects from ever being released, so
    nanobind (the bindings of triton, which torch 2.13's native ops import; triton is a
    dependency for torchtitan's export) printed 27 lines of "leaked instance" warnings after
    every calibration and traced plan. Every file a command writes is closed (and renamed
    into place) before it returns. Tests and other callers pass `argv` and get the status."""
    args = build_parser().parse_args(argv)
    status = run_command(args.handler, args)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
