"""Shared by the robustness tests (issue 14): run the CLI in-process and check a refusal, and
drop root's privileges so that file permissions are real."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from paraplan.cli import main

TINY = "gpt:layers=2,hidden=64,heads=2,vocab=128,seq=64"
"""A model the planner plans in well under a second."""
PLAN = ["plan", "--model", TINY, "--cluster", "2xcpu", "--global-batch", "4", "--no-progress"]
"""A `paraplan plan` command line that succeeds quickly."""


def run_cli(argv: Sequence[str]) -> int:
    """`paraplan argv` in-process; argparse's exit (bad arguments, --help) as its status."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def refused(
    capsys: pytest.CaptureFixture[str],
    argv: Sequence[str],
    *needles: str,
    within_s: float = 2.0,
) -> str:
    """Run the CLI: exit status 2, nothing on stdout, one error line on stderr (argparse adds
    its usage above it) that holds every needle, no traceback, within `within_s` seconds.
    Returns the error line."""
    start = time.perf_counter()
    code = run_cli(argv)
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert code == 2, (out, err)
    assert out == "" and "Traceback" not in err, err
    assert len(lines) == 1, err
    assert all(n in lines[0] for n in needles), (needles, lines[0])
    assert seconds < within_s, f"refused after {seconds:.1f} s: check before the work"
    return lines[0]


class Unprivileged:
    """Run as user `nobody` where the tests run as root (root ignores file permissions), so
    that permission errors are real; a no-op for other users. `home` and the folders above it
    are made traversable by others first."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = os.geteuid() == 0

    def __enter__(self) -> None:
        if self.root:
            for folder in (self.home, *self.home.parents):
                if folder == Path("/"):
                    break
                folder.chmod(folder.stat().st_mode | 0o005)
            os.setegid(65534)
            os.seteuid(65534)

    def __exit__(self, *exc: object) -> None:
        if self.root:
            os.seteuid(0)
            os.setegid(0)
