"""One-rank gloo workers for tests that must not start a process group in the test session (the
CI run of 2026-11-26 hung in such a test, in-process, for the rest of its 90 minutes): the test
file runs itself as a child process with a bounded wait, and a stuck child prints every
thread's stack before it exits."""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 120
"""A worker takes a few seconds; past this it is stuck (its stacks are dumped at 90% of it)."""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


def run_child(script: str) -> Any:
    """Run `script` (a test file whose `__main__` calls `child_main`) and return the JSON its
    worker printed. A stuck child is run once more, with a warning that carries its stacks."""
    proc = _run(script)
    if proc.returncode != 0 and "Timeout (" in proc.stderr:
        warnings.warn(
            f"a one-rank worker was stuck, run again:\n{proc.stderr[-3000:]}", stacklevel=2
        )
        proc = _run(script)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_main(worker: Callable[[], Any]) -> None:
    """The child's side: run `worker` under a watchdog and print its result as JSON."""
    faulthandler.dump_traceback_later(0.9 * CHILD_TIMEOUT_S, exit=True)
    print(json.dumps(worker()))
