"""Kernel times from measured curves (`paraplan calibrate`), in the shape of `compute.Kernels`.

A calibration measures, on the device at hand and in one dtype:

- GEMMs over a grid of shapes (M, N, K), forward (x @ w) and the two backward GEMMs autograd
  runs (g @ w^T and x^T @ g). A shape between grid points is priced by interpolating the
  achieved FLOP/s linearly in log2(M), log2(N), log2(K) (the rate varies smoothly with the
  logarithm of each dimension: cache blocking on CPUs, tile and wave quantization on GPUs);
  outside the grid the nearest edge's rate holds (large GEMMs saturate).
- fused attention (SDPA, causal) over a range of sizes: the achieved rate as a function of the
  dense forward FLOPs, interpolated in log space, forward and backward separately;
- memory-bound ops: the bandwidth an elementwise kernel streams at;
- the fixed cost of dispatching one operator (`launch_s`): on a CPU the Python, dispatcher and
  autograd bookkeeping per op, which dominates small models.

No torch here: the curves are plain numbers read from the cluster file.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

MEMORY_READ_WRITE = 2
"""An elementwise kernel reads its input and writes its output: the bandwidth benchmark
counts both, as `elementwise_s` is given the bytes streamed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmGrid:
    """Measured GEMM rates on a grid of shapes (FLOP/s, 2 FLOPs per multiply-add)."""

    m: tuple[int, ...]
    """Rows of the output (tokens), ascending."""
    n: tuple[int, ...]
    """Columns of the output (output features), ascending."""
    k: tuple[int, ...]
    """Reduction size (input features), ascending."""
    fwd_flops_per_s: tuple[float, ...]
    """Forward rate per grid point, flattened in (m, n, k) order (k fastest)."""
    bwd_flops_per_s: tuple[float, ...]
    """Backward rate (both gradient GEMMs together) per grid point, same order."""

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            axis = getattr(self, name)
            if not axis or any(x < 1 for x in axis) or list(axis) != sorted(set(axis)):
                raise ValueError(
                    f"GEMM grid axis {name}={axis!r} must be distinct positive sizes in "
                    "ascending order; re-run paraplan calibrate"
                )
        size = len(self.m) * len(self.n) * len(self.k)
        for name in ("fwd_flops_per_s", "bwd_flops_per_s"):
            rates = getattr(self, name)
            if len(rates) != size or not all(math.isfinite(r) and r > 0 for r in rates):
                raise ValueError(
                    f"GEMM grid {name} must hold {size} positive rates (one per (m, n, k)), "
                    f"got {len(rates)}; re-run paraplan calibrate"
                )


CURVE_WIDTH = 256
"""Heads x head size of every point of a measured attention curve (one sequence per call:
`profiler/microbench_attention.py`), so a point's dense forward FLOPs are 4 x 256 x S^2."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionCurve:
    """Measured fused attention (causal SDPA) rates against its dense forward FLOPs, one curve
    per head size: at equal FLOPs a narrow head runs slower (each score's softmax and masking
    is amortized over fewer multiply-adds; on this CPU 16-wide heads ran at 31 GFLOP/s, 64-wide
    at 55, 2026-11-25)."""

    head_dims: tuple[int, ...]
    """Head sizes measured, ascending."""
    dense_fwd_flops: tuple[float, ...]
    """Dense (unmasked) forward FLOPs of each measured call, ascending (the same for every
    head size)."""
    fwd_flops_per_s: tuple[float, ...]
    """Dense forward FLOPs over forward seconds, per (head size, FLOPs) point, head size
    major."""
    bwd_flops_per_s: tuple[float, ...]
    """Dense forward FLOPs over backward seconds, same order."""

    def __post_init__(self) -> None:
        n = len(self.dense_fwd_flops)
        if not n or list(self.dense_fwd_flops) != sorted(set(self.dense_fwd_flops)):
            raise ValueError(
                "attention curve: dense_fwd_flops must be distinct and ascending; re-run "
                "paraplan calibrate"
            )
        dims = self.head_dims
        if not dims or any(d < 1 for d in dims) or list(dims) != sorted(set(dims)):
            raise ValueError(
                f"attention curve: head_dims={dims!r} must be distinct positive sizes in "
                "ascending order; re-run paraplan calibrate"
            )
        size = n * len(dims)
        for name in ("fwd_flops_per_s", "bwd_flops_per_s"):
            rates = getattr(self, name)
            if len(rates) != size or not all(math.isfinite(r) and r > 0 for r in rates):
                raise ValueError(
                    f"attention curve: {name} must hold {size} positive rates (one per head "
                    "size and FLOPs point); re-run paraplan calibrate"
                )

    def rate(self, backward: bool, dense_fwd_flops: float, head_dim: int | None) -> float:
        """The rate at `dense_fwd_flops` (log-log in FLOPs within a head size, linear in
        log2(head size) between them, clamped at the ends). `head_dim` None: the measured
        size nearest 64, the common head size of published models."""
        rates = self.bwd_flops_per_s if backward else self.fwd_flops_per_s
        n = len(self.dense_fwd_flops)
        if head_dim is None:
            head_dim = min(self.head_dims, key=lambda d: abs(math.log2(d / 64)))
        log_rate = 0.0
        for i, w in _axis_weights(self.head_dims, head_dim):
            row = rates[i * n : (i + 1) * n]
            log_rate += w * math.log(_curve(self.dense_fwd_flops, row, dense_fwd_flops))
        return math.exp(log_rate)


@dataclass(frozen=True, kw_only=True, slots=True)
class OpRate:
    """Measured rate of one transcendental operator (tanh, exp, erf, ...)."""

    op: str
    """The aten overload packet, as the profiler records it (``aten.tanh``)."""
    elems_per_s: float
    """Output elements per second."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.elems_per_s) and self.elems_per_s > 0):
            raise ValueError(f"{self.op}: elems_per_s={self.elems_per_s!r} must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelFit:
    """Everything measured about one dtype's kernels on one device."""

    launch_s: float
    """Fixed seconds per operator (dispatch, autograd bookkeeping, kernel launch)."""
    elementwise_bw_bytes_per_s: float
    """Bytes per second (read + written) a memory-bound elementwise op streams."""
    gemm: GemmGrid
    """GEMM rates by shape."""
    attention: AttentionCurve | None = None
    """Fused attention rates (None: priced as GEMMs plus elementwise, unfused)."""
    stream_tensor_bytes: tuple[float, ...] = ()
    """Tensor sizes (bytes) of the elementwise bandwidth curve, ascending: small tensors stay
    in the caches and stream faster than `elementwise_bw_bytes_per_s` (measured far beyond
    them)."""
    stream_bw_bytes_per_s: tuple[float, ...] = ()
    """Bytes read + written per second by an elementwise op on each of those sizes."""
    special_rates: tuple[OpRate, ...] = ()
    """Transcendental operators' rates (a CPU computes tanh several times slower than it
    streams memory)."""
    raw_dispatch_s: float = 0.0
    """Seconds per operator outside autograd (an optimizer's in-place updates); 0: not
    measured, `launch_s` is used."""
    checkpoint_region_s: float = 0.0
    """Host seconds one activation-checkpoint region adds beyond its recomputed forward, fixed
    per region (`profiler/microbench_checkpoint.py`; 0: not measured)."""
    checkpoint_saved_tensor_s: float = 0.0
    """And per tensor the region's forward saves (its hooks pack, repack and unpack each;
    0: not measured, calibrations before 2026-11-26)."""
    gemm_cache_init_bytes: float = 0.0
    """Resident bytes the first GEMMs of this dtype leave behind, once per process (the BLAS's
    or oneDNN's runtime, beyond what `runtime_overhead_bytes` measured after an fp32 step;
    `profiler/microbench_cache.py`)."""
    gemm_shape_bytes: float = 0.0
    """Resident bytes each further distinct GEMM shape leaves behind: the kernel oneDNN
    generates and keeps per shape in its primitive cache (~550 KiB for a bf16 matmul on this
    CPU, ~30 KiB for fp32 through MKL; 0 on a GPU)."""
    page_fault_s_per_byte: float = 0.0
    """Seconds per byte of first touching freshly mapped memory, beyond writing memory the
    process already holds: the kernel's page fault and zeroing of each page
    (`profiler/microbench_stream.py`; 0.39 ns per byte on this VM, 13 ms for a 32 MiB output;
    0 on a GPU, whose caching allocator keeps freed blocks)."""

    def __post_init__(self) -> None:
        if len(self.stream_tensor_bytes) != len(self.stream_bw_bytes_per_s) or list(
            self.stream_tensor_bytes
        ) != sorted(set(self.stream_tensor_bytes)):
            raise ValueError(
                "stream_tensor_bytes must be distinct ascending sizes, one per "
                "stream_bw_bytes_per_s; re-run paraplan calibrate"
            )
        if not all(math.isfinite(b) and b > 0 for b in self.stream_bw_bytes_per_s):
            raise ValueError("stream_bw_bytes_per_s must hold positive rates")
        for name in (
            "raw_dispatch_s",
            "checkpoint_region_s",
            "checkpoint_saved_tensor_s",
            "gemm_cache_init_bytes",
            "gemm_shape_bytes",
            "page_fault_s_per_byte",
        ):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not (math.isfinite(self.launch_s) and self.launch_s >= 0):
            raise ValueError(f"launch_s={self.launch_s!r} must be a finite number >= 0")
        bw = self.elementwise_bw_bytes_per_s
        if not (math.isfinite(bw) and bw > 0):
            raise ValueError(f"elementwise_bw_bytes_per_s={bw!r} must be a positive number")

    def peak_gemm_flops_per_s(self) -> float:
        """The fastest forward GEMM rate measured (what the roofline calls peak)."""
        return max(self.gemm.fwd_flops_per_s)


def _axis_weights(axis: Sequence[int], x: float) -> tuple[tuple[int, float], ...]:
    """Grid indices and linear weights of `x` on a log2 axis (clamped at the ends)."""
    logs = [math.log2(v) for v in axis]
    lx = math.log2(max(x, 1.0))
    if lx <= logs[0] or len(logs) == 1:
        return ((0, 1.0),)
    if lx >= logs[-1]:
        return ((len(logs) - 1, 1.0),)
    hi = bisect.bisect_right(logs, lx)
    lo = hi - 1
    w = (lx - logs[lo]) / (logs[hi] - logs[lo])
    return ((lo, 1.0 - w), (hi, w))


MMAP_THRESHOLD_BYTES = 32 * 2**20
"""glibc malloc's largest mmap threshold on 64-bit systems (`DEFAULT_MMAP_THRESHOLD_MAX`,
mallopt(3)): an allocation this large or larger that the heap cannot serve from a free block
is mapped fresh from the OS and unmapped when freed, so it page-faults on first touch; below
it freed memory is reused. In a training step it is the fresh case: the fp32 loss tensors of
a GPT-2-small-sized head (1024 tokens x 8192 vocabulary, 32 MiB) were written at 2.1-2.6 GB/s
in the step where the same ops into reused memory stream at 25-45 GB/s (torch profiler,
2026-11-25)."""


def _curve(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """log-log linear interpolation of y(x), clamped at the ends."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    hi = bisect.bisect_right(xs, x)
    lo = hi - 1
    w = (math.log(x) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
    return math.exp((1 - w) * math.log(ys[lo]) + w * math.log(ys[hi]))


class CalibratedKernels:
    """`compute.Kernels` from a `KernelFit`: seconds of GEMMs, attention and elementwise ops
    as measured, each kernel also paying `launch_s` (memoized; the search asks repeatedly).

    `time_scale` multiplies every time: what `paraplan calibrate --from-run` learns when whole
    training steps run slower (or faster) than their kernels measured alone.

    `async_launch`: the device runs kernels while the host dispatches the next ones (CUDA's
    launch queue), so a layer costs the longer of its host work and its kernels, not their sum
    (`host_and_device_s`). On a CPU the same thread dispatches and computes: they add."""

    def __init__(
        self, fit: KernelFit, *, time_scale: float = 1.0, async_launch: bool = False
    ) -> None:
        self.fit = fit
        self.time_scale = time_scale
        self.async_launch = async_launch
        self.launch_s = fit.launch_s * time_scale
        """Seconds per operator dispatch."""
        self.gemm_s = cache(self._gemm_s)

    def _rate(self, rates: Sequence[float], m: int, n: int, k: int) -> float:
        g = self.fit.gemm
        log_rate = 0.0
        nn, nk = len(g.n), len(g.k)
        for i, wi in _axis_weights(g.m, m):
            for j, wj in _axis_weights(g.n, n):
                for q, wq in _axis_weights(g.k, k):
                    log_rate += wi * wj * wq * math.log(rates[(i * nn + j) * nk + q])
        return math.exp(log_rate)

    def _gemm_s(self, m: int, n: int, k: int, backward: bool = False) -> float:
        """Seconds of the (m x k) @ (k x n) forward GEMM, or of its two backward GEMMs."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        g = self.fit.gemm
        rates = g.bwd_flops_per_s if backward else g.fwd_flops_per_s
        flops = 2.0 * m * n * k * (2 if backward else 1)
        return flops / self._rate(rates, m, n, k) * self.time_scale

    def gemm_train_s(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(forward, backward) seconds of a GEMM (m, n, k) in training."""
        return self.gemm_s(m, n, k), self.gemm_s(m, n, k, True)

    def host_and_device_s(self, host_s: float, device_s: float) -> float:
        """Seconds of work with `host_s` of operator dispatch and `device_s` of kernels: their
        sum on a CPU; on a GPU the longer (kernels queue behind the host's launches and run
        while it dispatches the next: an H200 ran a 1B Llama's eager micro-batch in 180 ms of
        kernels while its ~3,400 operators took ~50 ms to dispatch, 2026-11-26)."""
        return max(host_s, device_s) if self.async_launch else host_s + device_s

    @property
    def dispatch_s(self) -> float:
        """Seconds per operator outside autograd (optimizer updates)."""
        return (self.fit.raw_dispatch_s or self.fit.launch_s) * self.time_scale

    def stream_s(self, nbytes: float, tensor_bytes: float) -> float:
        """Seconds to stream `nbytes` (read + written) through elementwise ops on tensors of
        about `tensor_bytes` each into reused memory: the measured bandwidth at that size
        (log-log interpolated; the first touch of fresh pages past the mmap threshold is
        `fresh_output_s`), or the large-tensor bandwidth when no curve was measured."""
        if nbytes <= 0:
            return 0.0
        fit = self.fit
        if not fit.stream_tensor_bytes:
            return self.elementwise_s(nbytes)
        bw = _curve(fit.stream_tensor_bytes, fit.stream_bw_bytes_per_s, max(tensor_bytes, 1.0))
        return nbytes / bw * self.time_scale

    def fresh_output_s(self, nbytes: float, tensor_bytes: float) -> float:
        """Seconds of first touching `nbytes` of fresh outputs of about `tensor_bytes` each,
        beyond streaming them (`stream_s`): 0 below the allocator's mmap threshold, where
        freed memory is handed out again; past it every page of every output faults, at the
        measured `KernelFit.page_fault_s_per_byte`."""
        if nbytes <= 0 or tensor_bytes < MMAP_THRESHOLD_BYTES:
            return 0.0
        return nbytes * self.fit.page_fault_s_per_byte * self.time_scale

    def special_s(self, op: str, elems: float, elem_bytes: float, tensor_bytes: float) -> float:
        """Seconds of a transcendental operator over `elems` output elements: its measured
        rate (taken on an activation-sized tensor), but no faster than streaming one input and
        its output at `tensor_bytes` (a roofline: a log-softmax over a head's logits, 32 MiB
        or more, is bound by the fresh output's page faults, not by its exp and log; 17.7 ms
        measured for 1024 x 8192 fp32 elements on this CPU where its rate gives 5.5 ms)."""
        if elems <= 0:
            return 0.0
        stream_s = self.stream_s(2 * elems * elem_bytes, tensor_bytes)
        for rate in self.fit.special_rates:
            if rate.op == op:
                return max(elems / rate.elems_per_s * self.time_scale, stream_s)
        return stream_s

    def elementwise_s(self, nbytes: float) -> float:
        """Seconds to stream `nbytes` (read + written) through memory-bound kernels."""
        return max(0.0, nbytes) / self.fit.elementwise_bw_bytes_per_s * self.time_scale

    def attention_s(
        self,
        dense_fwd_flops: float,
        causal: bool = True,
        head_dim: int | None = None,
        seq_len: int | None = None,
    ) -> tuple[float, float]:
        """(forward, backward) seconds of fused attention of `dense_fwd_flops` (unmasked
        forward FLOPs) with heads `head_dim` wide over sequences of `seq_len` tokens. The curve
        was measured causal; a non-causal call does twice the work.

        On a host CPU the rate is the curve's at the call's own sequence length (its point of
        `CURVE_WIDTH` heads x head size, one sequence): one thread runs each (sequence, head)
        in turn, so a call's time grows linearly with batch x heads at a given length, while
        the rate per FLOP rises with the length (each score row's softmax over more
        multiply-adds). Measured on this CPU (2026-11-29, one thread, causal SDPA, 4 heads of
        16, 128 tokens): backward 1.27 / 2.49 / 4.83 / 9.6 ms in bf16 and 0.24 / 0.46 / 0.85 /
        1.74 ms in fp32 at batch 1 / 2 / 4 / 8; looked up by FLOPs alone, batch 2 read the
        curve at 90 tokens and was priced 43% (bf16) and 14% (fp32) slow. Without `seq_len`,
        and on a GPU (whose rate also grows with the rows that fill its SMs), by FLOPs."""
        if dense_fwd_flops <= 0:
            return 0.0, 0.0
        curve = self.fit.attention
        if curve is None:  # no fused kernel measured: the GEMM rate of a square-ish shape
            rate = self.fit.peak_gemm_flops_per_s()
            f = dense_fwd_flops * (0.5 if causal else 1.0) / rate
            return f * self.time_scale, 2.5 * f * self.time_scale
        at = dense_fwd_flops
        if seq_len is not None and not self.async_launch:
            at = 4.0 * CURVE_WIDTH * seq_len * seq_len
        f = dense_fwd_flops / curve.rate(False, at, head_dim)
        b = dense_fwd_flops / curve.rate(True, at, head_dim)
        work = 1.0 if causal else 2.0
        return f * work * self.time_scale, b * work * self.time_scale

    def math_attention_s(
        self, batch_heads: int, seq_q: int, seq_k: int, head_dim: int, core_bytes: float
    ) -> tuple[float, float]:
        """(forward, backward) seconds of unfused attention: the batched GEMMs QK^T and AV
        priced from the grid as (batch_heads * seq_q) rows, and the softmax, mask and dropout
        streaming `core_bytes` (written then read: 2x forward, 3x backward, as the catalog
        model assumes)."""
        m = batch_heads * seq_q
        qk_f, qk_b = self.gemm_train_s(m, seq_k, head_dim)
        av_f, av_b = self.gemm_train_s(m, head_dim, seq_k)
        return (
            qk_f + av_f + self.elementwise_s(2 * core_bytes),
            qk_b + av_b + self.elementwise_s(3 * core_bytes),
        )
