"""One search shared by several processes (`Search.run`), on the cores a large space can use.

Each process runs the same best-first branch and bound (`Search._explore`) over the same queue
of blocks, built once before the processes fork. A process takes a block only by claiming it
(a flag per block, set under a lock), so every block is explored by exactly one process, in
the queue's order, whichever process is free first; the work a process defers from its own
blocks stays with it. The processes share the K-th best step time found by any of them: each
prunes against the lesser of its own and that one. That keeps the search exact: the shared
figure is always some process's own K-th best, so whatever is slower than it is slower than
K strategies already found, and cannot be among the K best of all. The kept strategies of all
processes, merged by the same ranking, are then the K best of the whole space: the same
result as one process, in less time (issue 16's cases: about 1.4-1.6x on two cores).

What is not the same from run to run is only what depends on which process took which block:
`SearchResult.evaluated` and, when something fits, the least-memory strategy among those
visited. When nothing fits, nothing is pruned by time, so both equal one process's.

Linux only (`os.fork`: the processes inherit the evaluator and its memos without pickling
them); elsewhere, with one usable core, or on a small space, one process searches. A child
that fails makes the parent search again alone (never a partial answer).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pickle
import signal
import struct
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from . import replay_store
from .cost.evaluate import Estimate
from .cost.rules import Rule, Violation
from .search_blocks import keep_best
from .strategy import Strategy

WORKERS_ENV = "PARAPLAN_SEARCH_WORKERS"
"""Environment variable: how many processes a search may use (1: never fork)."""
MAX_WORKERS = 4
"""At most this many processes by default: each warms its own memos, so more cores give less."""
MIN_SHARED_BLOCKS = 200
"""A queue of fewer blocks is searched by one process (a block takes about 1-3 ms here; the
fork and the merge about 10 ms, and each process warms its own memos)."""
_INCUMBENT = struct.Struct("d")


@dataclass(slots=True)
class Explored:
    """What one process's exploration found (`Search._explore`), before the result is made."""

    kept: list[Estimate]
    """The K best it kept (any order)."""
    evaluated: int
    """Strategies it considered (`SearchResult.evaluated`)."""
    violations: Counter[Rule]
    """Structural rules its candidates broke, counted."""
    examples: dict[Rule, Violation]
    """One violation of each rule in `violations`."""
    min_mem: tuple[float, Strategy] | None
    """The least peak memory it saw, and where."""
    unrunnable: str | None
    """One strategy the executor cannot run, with the reason (for the error message)."""


class Share:
    """What the processes of one search share: the K-th best step time any has found (inf
    until one has K) and which blocks are claimed, in one anonymous shared mapping; claims
    are taken under a POSIX record lock on the mapping's memory file (owned by a process, so
    the kernel releases it if that process dies holding it: no hang)."""

    def __init__(self, num_blocks: int) -> None:
        size = _INCUMBENT.size + 8 + num_blocks
        self._fd = os.memfd_create("paraplan-search")  # Linux; OSError: the caller searches alone
        os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)  # MAP_SHARED: the forks see the same bytes
        _INCUMBENT.pack_into(self._map, 0, float("inf"))
        self._flags = _INCUMBENT.size + 8  # offset of the claim flags; before: claimed count

    def worst_s(self, own_s: float) -> float:
        """The lesser of `own_s` (this process's K-th best) and the shared one, which it
        becomes when lower. The update is not atomic: a lower figure another process wrote
        meanwhile may be overwritten by this one, which only prunes less (still exact)."""
        shared = _INCUMBENT.unpack_from(self._map, 0)[0]
        if own_s < shared:
            _INCUMBENT.pack_into(self._map, 0, own_s)
            return own_s
        return shared

    def claim(self, index: int) -> int:
        """Claim block `index` of the queue: the number of blocks claimed so far by all
        processes with this one, or 0 when another process has it."""
        at = self._flags + index
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            if self._map[at]:
                return 0
            self._map[at] = 1
            count = int.from_bytes(self._map[_INCUMBENT.size : self._flags], "little") + 1
            self._map[_INCUMBENT.size : self._flags] = count.to_bytes(8, "little")
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        return count

    def close(self) -> None:
        """Release the mapping and its file."""
        self._map.close()
        os.close(self._fd)


class Kept:
    """The K best strategies one process has found (a min-heap whose top is the worst kept,
    `search_blocks.keep_best`) and the K-th best step time to prune against: its own, or with
    a `Share` the least any process of the search has found. `full` once that is finite: the
    search can then no longer end empty, and whatever is slower than it cannot rank."""

    def __init__(self, keep: int, share: Share | None = None) -> None:
        self._heap: list[tuple] = []
        self._keep = keep
        self._share = share

    def worst_s(self) -> float:
        """The K-th best step time found (inf until K are found)."""
        heap = self._heap
        own = -heap[0][0] if len(heap) == self._keep else float("inf")
        return own if self._share is None else self._share.worst_s(own)

    def full(self) -> bool:
        """Whether K strategies are found (by this process, or by any with a `Share`)."""
        return self.worst_s() < float("inf")

    def push(self, est: Estimate) -> None:
        """Keep `est` if it is among the K best this process has found."""
        keep_best(self._heap, self._keep, est)

    def estimates(self) -> list[Estimate]:
        """What this process keeps (any order)."""
        return [e[3] for e in self._heap]


def workers_from_env() -> int | None:
    """The process count `PARAPLAN_SEARCH_WORKERS` asks for (None when unset); a value that
    is not a whole number >= 1 is refused (ValueError naming it, the rule and the fix)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{WORKERS_ENV}={raw!r}: must be a whole number of processes >= 1; unset it to "
            "use the usable cores, or set 1 to search in one process"
        )
    return int(raw)


def worker_count(num_blocks: int, asked: int | None = None) -> int:
    """How many processes search a queue of `num_blocks` blocks: `asked` (or what
    `workers_from_env` asks) when given, else up to `MAX_WORKERS` of the usable cores if the
    queue has at least `MIN_SHARED_BLOCKS` blocks; one off Linux."""
    if asked is None:
        asked = workers_from_env()
    if asked == 1 or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    if asked is not None:
        return asked
    if num_blocks < MIN_SHARED_BLOCKS:
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def explore_shared(
    explore: Callable[[Share], Explored], num_blocks: int, workers: int, keep: int
) -> Explored | None:
    """`explore` run by `workers` processes (this one and `workers - 1` forks) sharing one
    `Share` of a `num_blocks` queue, their findings merged (`keep` best); None when a child
    could not be started or failed (then the caller searches alone)."""
    try:
        share = Share(num_blocks)
    except (OSError, AttributeError):  # no memory files (os.memfd_create): search alone
        return None
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    try:
        for _ in range(workers - 1):
            read, write = os.pipe()
            try:
                with warnings.catch_warnings():  # Python 3.12 warns on fork with threads alive
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:  # no process to spare (limits, a sandbox): search alone
                os.close(read)
                os.close(write)
                return None
            if pid == 0:  # the child: explore, send, and leave without any cleanup
                os.close(read)
                _child(explore, share, write)
            os.close(write)
            children.append((pid, read))
        found = explore(share)
        while children:
            pid, read = children.pop(0)
            with os.fdopen(read, "rb") as pipe:
                data = pipe.read()
            _, status = os.waitpid(pid, 0)
            if not data or status != 0:
                return None
            found = merge(found, pickle.loads(data), keep)
        return found
    finally:
        share.close()
        for pid, read in children:  # on an error here or in a child: stop the others
            os.close(read)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _child(explore: Callable[[Share], Explored], share: Share, write: int) -> None:
    """A forked child's whole life: never returns into the caller's code."""
    code = 1
    try:
        found = explore(share)
        replay_store.STORE.flush()  # the replays it computed (the parent's are its own)
        data = pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
        code = 0
    except BaseException:  # the parent searches again alone: nothing to report
        pass
    finally:
        os._exit(code)


def merge(a: Explored, b: Explored, keep: int) -> Explored:
    """Two processes' findings as one: the `keep` best of both (by the search's ranking), the
    counts added, the least memory of both."""
    heap: list[tuple] = []
    for est in (*a.kept, *b.kept):
        keep_best(heap, keep, est)
    examples = dict(b.examples)
    examples.update(a.examples)
    mems = [m for m in (a.min_mem, b.min_mem) if m is not None]
    return Explored(
        kept=[e[3] for e in heap],
        evaluated=a.evaluated + b.evaluated,
        violations=a.violations + b.violations,
        examples=examples,
        min_mem=min(mems, key=lambda m: m[0]) if mems else None,
        unrunnable=a.unrunnable or b.unrunnable,
    )
