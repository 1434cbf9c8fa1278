"""The line of a calibration rank's traceback worth showing, and rank 0's result still queued
when another rank's exit is seen first (`microbench_run.calibrate`)."""

from __future__ import annotations

import os
import queue
import re
from typing import Any

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:")
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def rank_error(traceback_text: str) -> str:
    """The line of a rank's traceback that names its exception, and where it was raised: a
    CUDA error's message runs over several lines whose last only says to compile with
    TORCH_USE_CUDA_DSA."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    if not lines:
        return traceback_text
    heads = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    head = heads[-1] if heads else len(lines) - 1
    frames = [m for line in lines[:head] if (m := _FRAME_LINE.match(line))]
    if not frames:
        return lines[head].strip()
    file, line, func = frames[-1].groups()
    return f"{lines[head].strip()} (at {os.path.basename(file)}:{line} in {func})"


RESULT_GRACE_S = 5.0
"""Seconds to wait for rank 0's result still in flight when another rank's exit is seen first."""


def queued_result(out: Any, grace_s: float = RESULT_GRACE_S) -> Any | None:
    """The first non-progress message in the ranks' queue (rank 0's result: ("result",
    payload) after any ("tick", label)), or None when none comes within `grace_s`."""
    while True:
        try:
            kind, payload = out.get(timeout=grace_s)
        except queue.Empty:
            return None
        if kind != "tick":
            return payload
