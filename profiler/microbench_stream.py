"""Microbenchmarks of memory-bound and transcendental operators (`paraplan calibrate`): the
bandwidth of an elementwise op by tensor size, the element rate of each transcendental the
profiler records, and what first touching fresh pages costs.

Eager training allocates every output fresh. Below the C library's mmap threshold the
allocator hands back memory the process already touched; at or above it (32 MiB at most with
glibc, `planner.cost.calibrated.MMAP_THRESHOLD_BYTES`) an output the heap cannot hold is
mapped fresh from the OS and unmapped on free, so the operator writing it page-faults on every
page. On this 2-core EPYC VM (2026-11-25, one thread): `x * 1.0001` streamed 26 GB/s into a
reused 32 MiB output and 4.2 GB/s into a fresh one; `empty().fill_(0)` 2.4 GB/s. Whether a
given allocation of that size is fresh depends on the heap's history, so the fault is measured
on its own, on a fresh anonymous mapping, not through the allocator.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from functools import partial

import torch

from ..planner.cost.calibrated import MMAP_THRESHOLD_BYTES, OpRate
from .microbench_cold import ColdOperands, ColdPool
from .microbench_timer import Timer
from .tracer import SPECIAL_OPS

STREAM_SIZES_BYTES = (2**16, 2**18, 2**20, 2**22, 2**24)
"""Tensor sizes of the elementwise bandwidth curve: 64 KiB (L2) to 16 MiB (beyond L3 of a
small VM's share)."""
ELEMENTWISE_BYTES = 32 * 2**20
"""Tensor size of the bandwidth benchmark: far beyond the caches."""
GPU_STREAM_SIZES_BYTES = (2**18, 2**20, 2**22, 2**24, 2**26, 2**28)
"""The curve's sizes on a GPU: 256 KiB to 256 MiB. A kernel over a few MiB lasts a few
microseconds there, about its launch and the timer's synchronization; an H100's 50 MB L2
holds tensors up to tens of MiB, and a 1B model's activations are 32-128 MiB per tensor."""
GPU_ELEMENTWISE_BYTES = 512 * 2**20
"""The bandwidth benchmark's tensor on a GPU: 1 GiB streamed is ~0.3 ms at 3-5 TB/s, so the
~10 us of launch and synchronization each timed call pays is ~3% (32 MiB: ~50%)."""


def stream_sizes_bytes(device: torch.device) -> tuple[int, ...]:
    """The elementwise curve's tensor sizes on `device`."""
    return GPU_STREAM_SIZES_BYTES if device.type == "cuda" else STREAM_SIZES_BYTES


def elementwise_bytes(device: torch.device) -> int:
    """The bandwidth benchmark's tensor size on `device`."""
    return GPU_ELEMENTWISE_BYTES if device.type == "cuda" else ELEMENTWISE_BYTES


STREAM_REPEATS = 31
"""Timed calls of each elementwise measurement (cheap; a fresh output's page faults make
single calls jitter)."""
FAULT_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""Bytes of the fresh mapping the page-fault benchmark writes."""
_PRIVATE = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
"""Private anonymous pages, as malloc maps them (Python's default for an anonymous mmap is a
shared mapping, whose pages fault through shared memory: ~1.6x dearer here)."""
FAULT_REPEATS = 5
"""Timed writes of the page-fault benchmark (each ~30 ms on this VM)."""


def bandwidth_bytes_per_s(timer: Timer, dtype: torch.dtype, raw_s: float) -> float:
    """Bytes read plus written per second by an elementwise op on a large tensor."""
    elems = elementwise_bytes(timer.device) // torch.finfo(dtype).bits * 8
    x = torch.ones(elems, dtype=dtype, device=timer.device)
    out = torch.empty_like(x)
    seconds = timer(lambda: torch.mul(x, 1.0001, out=out))
    return 2 * x.numel() * x.element_size() / max(seconds - raw_s, 1e-9)


def stream_curve(
    timer: Timer, dtype: torch.dtype, raw_s: float, sizes: tuple[int, ...], pool: ColdPool
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(tensor bytes, bytes read + written per second) of an elementwise op on tensors of
    each size, its input coming from memory and its output freshly allocated, as in a
    training step (`microbench_cold`): small tensors still stream faster (latency hidden,
    output in the caches)."""
    rates = []
    for nbytes in sizes:
        elems = max(1, nbytes * 8 // torch.finfo(dtype).bits)
        ops = pool.operands([(elems,)])
        seconds = timer(partial(_rotating, _scaled, ops), STREAM_REPEATS)
        rates.append(2 * elems * pool.buffer.element_size() / max(seconds - raw_s, 1e-9))
    return tuple(float(n) for n in sizes), tuple(rates)


def page_fault_s_per_byte(timer: Timer) -> float:
    """Seconds per byte that writing freshly mapped memory takes beyond writing memory already
    mapped: each call maps `FAULT_BYTES` anonymous pages, copies into them and unmaps them
    (the kernel faults and zeroes every page), against the same copy into one mapping kept
    (0 on a GPU: torch's caching allocator keeps device memory)."""
    if timer.device.type != "cpu" or not _PRIVATE:
        return 0.0
    payload = bytes(FAULT_BYTES)
    kept = mmap.mmap(-1, FAULT_BYTES, flags=_PRIVATE)
    kept.write(payload)

    def fresh() -> None:
        with mmap.mmap(-1, FAULT_BYTES, flags=_PRIVATE) as region:
            region.write(payload)

    def reused() -> None:
        kept.seek(0)
        kept.write(payload)

    try:
        extra_s = timer(fresh, FAULT_REPEATS) - timer(reused, FAULT_REPEATS)
    finally:
        kept.close()
    return max(0.0, extra_s) / FAULT_BYTES


def special_rates(
    timer: Timer, dtype: torch.dtype, raw_s: float, pool: ColdPool
) -> tuple[OpRate, ...]:
    """Elements per second of each transcendental operator the profiler records
    (`tracer.SPECIAL_OPS`), on an activation-sized tensor from memory: 256 x 1024 on a CPU,
    8192 x 8192 on a GPU (a 1B Llama's MLP activation per micro-batch; at the CPU's size a
    GPU kernel lasts about its launch: the first H200 calibration priced silu 40x slower
    than it ran, 2026-11-26)."""
    aten = torch.ops.aten
    shape = (8192, 8192) if timer.device.type == "cuda" else (256, 1024)
    one, two = pool.operands([shape]), pool.operands([shape, shape])

    def unary(op: Callable[..., object], *args: object) -> Callable[[], object]:
        return lambda: op(one.next()[0], *args)

    def binary(op: Callable[..., object], *args: object) -> Callable[[], object]:
        return lambda: op(*two.next(), *args)

    calls: dict[str, Callable[[], object]] = {
        "aten.tanh": unary(aten.tanh),
        "aten.exp": unary(aten.exp),
        "aten.erf": unary(aten.erf),
        "aten.sigmoid": unary(aten.sigmoid),
        "aten.silu": unary(aten.silu),
        "aten.gelu": unary(aten.gelu),
        "aten.gelu_backward": binary(aten.gelu_backward),
        "aten.silu_backward": binary(aten.silu_backward),
        "aten._softmax": unary(aten._softmax, -1, False),
        "aten._log_softmax": unary(aten._log_softmax, -1, False),
        "aten._log_softmax_backward_data": binary(aten._log_softmax_backward_data, -1, dtype),
        "aten.sin": unary(aten.sin),
        "aten.cos": unary(aten.cos),
        "aten.log": unary(aten.log),  # the pool holds ones: log is defined
    }
    if missing := SPECIAL_OPS - set(calls):  # a traced operator this benchmark does not time
        raise RuntimeError(f"no calibration benchmark for {sorted(missing)}: add one here")
    elems = shape[0] * shape[1]
    return tuple(
        OpRate(op=op, elems_per_s=elems / max(timer(call, STREAM_REPEATS) - raw_s, 1e-9))
        for op, call in sorted(calls.items())
    )


def _rotating(fn: Callable[..., object], ops: ColdOperands) -> object:
    """`fn` on the next slot of `ops` (operands from memory)."""
    return fn(*ops.next())


def _scaled(x: torch.Tensor) -> torch.Tensor:
    """The elementwise op of the bandwidth curve (a fresh output, as in eager training)."""
    return torch.mul(x, 1.0001)
