"""The line of a calibration rank's traceback worth showing (`microbench_run.calibrate`)."""

from __future__ import annotations

import os
import re

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
