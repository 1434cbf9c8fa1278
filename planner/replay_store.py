"""Schedule replays kept on disk between runs, so that planning again does not replay again
(issue 16).

The cost model prices a split-backward schedule's fill and drain and every pipeline schedule's
in-flight micro-batches by replaying torch's operation orders (`cost/schedules.py`,
`solvers/replay_table.py`): pure functions of the schedule, the stage count, the micro-batches
and the rounded shares of the seconds. A process memoizes them (`functools.lru_cache`), but
every `paraplan plan` is a new process, and on issue 16's 1T GPT those first replays took
0.13 s of its 1 s (2026-11-28). This store keeps their answers in the user cache folder
(`user_cache.cache_dir`, off under `PARAPLAN_NO_CACHE=1`), one JSON file per (kind, schedule,
stages), under a digest of the source of every module whose code decides them: a changed
replay never serves old answers. Floats are written with `repr`, so an answer read back is the
one computed, bit for bit.

Best effort and never wrong: a file that does not read, does not parse, does not match the
SHA-256 its first line records, or holds anything but finite numbers is ignored (and rewritten
at the next flush); a folder that cannot be written leaves the plan uncached. Answers are added
by the processes that compute them and written by `flush` (the end of `planner.api.make_plan`,
and each search process before it exits, `search_workers.py`), merged with what other
processes wrote meanwhile; a file keeps at most `MAX_ENTRIES` answers (the newest). Nothing
happens at import time.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import cache
from pathlib import Path

from .outputs import write_atomic
from .strategy import Schedule
from .user_cache import cache_dir

MAX_ENTRIES = 4096
"""Answers one file keeps (the newest; a file of the largest answers is about 4 MB)."""
MAX_FILE_BYTES = 8 * 2**20
"""A file larger than this is not read (nothing this store writes is)."""
_SOURCES = (
    "strategy.py",
    "cost/schedules.py",
    "solvers/replay_table.py",
    "solvers/pipeline_replay.py",
    "solvers/pipeline_orders.py",
)
"""The modules (below `planner/`) whose code decides a replay's answer."""

Value = float | tuple[float, ...]
"""An answer: a makespan or bubble, or a tuple of per-stage in-flight peaks."""


@cache
def _digest() -> str:
    """SHA-256 of `_SOURCES`, the first 16 hex digits: the folder of this code's answers."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _SOURCES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def _key(args: tuple[float | int, ...]) -> str:
    """The text key of an answer's remaining arguments (`repr`: floats exactly)."""
    return ",".join(repr(a) for a in args)


def _answer(raw: object) -> Value | None:
    """An answer read from a file, or None when it is not one (a finite number or a list of
    them)."""
    if isinstance(raw, float | int) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    if isinstance(raw, list) and all(
        isinstance(x, float | int) and not isinstance(x, bool) and math.isfinite(x) for x in raw
    ):
        return tuple(float(x) for x in raw)
    return None


def _read(path: Path) -> dict[str, Value]:
    """The answers in `path` ({} when it is missing, too large, or not a file of answers: a
    header line with the SHA-256 of the JSON object that follows, as `_text` writes it)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return {}
        header, _, body = path.read_text(encoding="utf-8").partition("\n")
        if json.loads(header) != {"sha256": hashlib.sha256(body.encode()).hexdigest()}:
            return {}  # truncated or edited
        raw = json.loads(body)
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    out: dict[str, Value] = {}
    for key, value in raw.items():
        answer = _answer(value)
        if answer is None:
            return {}  # edited or damaged: none of it is trusted
        out[key] = answer
    return out


def _text(answers: dict[str, Value]) -> str:
    """A file's text: the header line (the body's SHA-256), then the answers as JSON."""
    body = json.dumps(answers, separators=(",", ":"))
    return json.dumps({"sha256": hashlib.sha256(body.encode()).hexdigest()}) + "\n" + body


class ReplayStore:
    """The answers of this process: read per file on first use, written by `flush`."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Value]] = {}
        self._new: dict[str, dict[str, Value]] = {}

    def _folder(self) -> Path | None:
        found = cache_dir()
        return None if found is None else found / "replays" / _digest()

    def get(self, kind: str, schedule: Schedule, pp: int, args: tuple) -> Value | None:
        """The stored answer of `kind` for (schedule, pp, *args), or None."""
        group = f"{kind}-{schedule.value}-{pp}"
        answers = self._groups.get(group)
        if answers is None:
            folder = self._folder()
            answers = self._groups[group] = {} if folder is None else _read(folder / group)
        return answers.get(_key(args))

    def put(self, kind: str, schedule: Schedule, pp: int, args: tuple, value: Value) -> None:
        """Keep `value` as that answer (written at the next `flush`; not a non-finite one)."""
        if _answer(list(value) if isinstance(value, tuple) else value) is None:
            return
        group, key = f"{kind}-{schedule.value}-{pp}", _key(args)
        self._groups.setdefault(group, {})[key] = value
        self._new.setdefault(group, {})[key] = value

    def flush(self) -> None:
        """Write the answers added since the last flush, each file merged with what it holds
        now (another process may have added to it), the newest `MAX_ENTRIES` kept. Silent when
        the folder cannot be written (the next run computes them again)."""
        new, self._new = self._new, {}
        folder = self._folder()
        if folder is None or not new:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for group, answers in new.items():
                merged = _read(folder / group)
                merged.update(answers)
                kept = dict(list(merged.items())[-MAX_ENTRIES:])
                write_atomic(folder / group, _text(kept))
        except (OSError, ValueError):
            pass  # a read-only cache folder: planning goes on, uncached


STORE = ReplayStore()
"""This process's store (nothing is read until an answer is asked for)."""
