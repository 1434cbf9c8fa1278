"""Host (CPU) memory as the planner prices it: resident memory less what the C allocator keeps
free, and the peak of torch's live CPU tensors over one step.

Why not peak RSS. The planner predicts the bytes a step needs: the runtime's own footprint plus
the live tensors at the step's peak. On CUDA the run measures exactly that
(`torch.cuda.max_memory_allocated` plus the memory outside torch's allocator); the caching
allocator's reserved-but-free blocks are left out. On the CPU, torch allocates from glibc's
malloc, which keeps freed chunks below its (dynamic, up to 32 MiB) mmap threshold in its arenas
instead of returning them: peak RSS then includes heap fragmentation that depends on the
order of frees, 40% over the live bytes on a 6-layer GPT here (docs/cost-model.md §12). So a
CPU rank measures the same quantity as a CUDA rank:

    live peak = (resident now - glibc's free bytes now)   at the step's start
              + the peak rise of torch's CPU allocations during the step

The first term is the process's resident memory less the free chunks glibc retains
(`mallinfo2().fordblks`, summed over its arenas: glibc manual, "Statistics for Memory
Allocation with malloc"); it counts the runtime and every tensor live at the step's start. The
second comes from torch's profiler with `profile_memory=True`, which reports every allocation and
free of the CPU allocator in order (`c10::reportMemoryUsageToProfiler`). The peak RSS is
reported next to it, so the allocator's retention is visible, not hidden.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

import torch

_KIB = 1024
"""Linux reports ru_maxrss in KiB (macOS in bytes)."""
MEMORY_EVENT = "[memory]"
"""Name of the profiler's allocator events (torch.autograd.profiler.MEMORY_EVENT_NAME)."""


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc >= 2.33), every field size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> _MallInfo2 | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # musl, or glibc older than 2.33
        return None
    fn.restype = _MallInfo2
    return fn()  # type: ignore[no-any-return]


def allocator_free_bytes() -> int | None:
    """Bytes glibc's malloc holds free in its arenas (retained, not returned to the OS);
    None where that cannot be read (not glibc)."""
    info = _mallinfo2()
    return None if info is None else int(info.fordblks)


def resident_bytes() -> int:
    """The process's resident memory now (/proc/self/statm; peak RSS where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_resident_bytes()


def peak_resident_bytes() -> int:
    """The process's peak resident memory so far (getrusage ru_maxrss)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * _KIB)


def live_resident_bytes() -> int:
    """Resident memory less the free chunks the C allocator keeps (resident memory where the
    allocator cannot be asked)."""
    free = allocator_free_bytes()
    rss = resident_bytes()
    return rss if free is None else max(0, rss - free)


@dataclass(frozen=True, kw_only=True, slots=True)
class HostPeak:
    """One step's host memory, measured."""

    live_peak_bytes: float
    """Resident memory less allocator free bytes at the step's start, plus the peak rise of
    torch's CPU allocations during the step."""
    start_bytes: float
    """The first term: runtime plus tensors live at the step's start."""
    rise_bytes: float
    """The second: the highest point of allocations less frees during the step."""
    events: int
    """Allocator events the profiler saw (0: the measurement failed)."""


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's start/stop lines and its once-only
    warning about blocks allocated before it started come from C++ and are noise here."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class TensorPeakTracker:
    """`with TensorPeakTracker() as t: step()` then `t.result()`: the step's live peak
    (`HostPeak`). Measures on the calling thread (where autograd runs the CPU backward)."""

    def __init__(self) -> None:
        self._start = 0
        self._prof: torch.profiler.profile | None = None

    def __enter__(self) -> TensorPeakTracker:
        self._start = live_resident_bytes()
        self._prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        )
        primer = torch.empty(1)
        with _quiet_stderr():
            self._prof.__enter__()
            del primer  # freed unseen by the profiler: its once-only warning goes here
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._prof is not None:
            with _quiet_stderr():
                self._prof.__exit__(exc_type, exc, tb)

    def result(self) -> HostPeak:
        """The measured step (after the `with` block)."""
        profiler = None if self._prof is None else self._prof.profiler
        results = None if profiler is None else profiler.kineto_results
        if results is None:
            raise RuntimeError("TensorPeakTracker.result(): call it after its `with` block ends")
        cpu = torch._C._autograd.DeviceType.CPU
        events = sorted(
            (e for e in results.events() if e.name() == MEMORY_EVENT and e.device_type() == cpu),
            key=lambda e: e.start_ns(),
        )
        level = peak = 0
        for e in events:
            level += int(e.nbytes())  # type: ignore[union-attr,attr-defined]
            peak = max(peak, level)
        return HostPeak(
            live_peak_bytes=float(self._start + peak),
            start_bytes=float(self._start),
            rise_bytes=float(peak),
            events=len(events),
        )
