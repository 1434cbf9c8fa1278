"""Microbenchmarks of one rank: GEMMs, fused attention, elementwise bandwidth, per-op dispatch,
copies and collectives, each timed as the median of repeated calls.

Every rank of a calibration runs them at the same time, in lockstep (a barrier before each
measurement), so that the figures include what ranks sharing a machine take from each other
(cores, memory bandwidth): that is how they run in training. `profiler/microbench_run.py`
starts the ranks and turns the timings into a `planner.calibration.Calibration`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from ..planner.calibration import CollectiveKind, CollectivePoint
from ..planner.cost.calibrated import GemmGrid, KernelFit
from .microbench_attention import attention_curve
from .microbench_cold import ColdPool
from .microbench_stream import (
    _rotating,
    bandwidth_bytes_per_s,
    elementwise_bytes,
    page_fault_s_per_byte,
    special_rates,
    stream_curve,
    stream_sizes_bytes,
)
from .microbench_timer import Timer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Planner dtype keys -> torch dtypes."""
CHAIN_OPS = 64
"""Tiny ops in the chain that times per-op dispatch."""
MIN_RATE = 1e6
"""Floor of a measured rate (FLOP/s): a GEMM no slower than its dispatch still has a rate."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """How much to measure: `paraplan calibrate` (full) or `--quick`."""

    gemm_sizes: tuple[int, ...]
    """Grid values of M, N and K."""
    max_call_s: float
    """A GEMM expected to take longer than this is not run (its rate is taken from the
    largest measured neighbour: large GEMMs saturate)."""
    repeats: int
    """Timed calls per measurement (after one warm-up call)."""
    attention_seqs: tuple[int, ...]
    """Sequence lengths of the attention curve."""
    attention_head_dims: tuple[int, ...]
    """Head sizes of the attention curve (the rate at equal FLOPs falls with the head size:
    GPT-2 tiny's 16-wide heads ran causal SDPA at 31 GFLOP/s on this CPU, 64-wide at 55)."""
    collective_bytes: tuple[int, ...]
    """Message sizes of the collectives."""
    collective_repeats: int
    """Timed calls per collective (more than kernels: small messages jitter on a shared host,
    and their mean is what a step pays)."""
    gemm_budget_s: float
    """Seconds of GEMM measurement per dtype, shared by its rounds; the points left take their
    neighbours' rates (a slow dtype, such as bf16 on a CPU without bf16 units, measures only
    small shapes)."""
    rounds: int
    """Rounds of the kernel benchmarks, one after the other; every figure keeps its median
    round (`microbench_rounds.py`: an outlier in one round is dropped)."""
    runtime_rounds: int | None = None
    """Alternations of the TP-block and FSDP2-unit benchmarks (None: their own counts,
    `microbench_tp.TP_ROUNDS`, `FSDP_ROUNDS`)."""
    runtime_repeats: int | None = None
    """Timed calls per measurement of those (None: `microbench_tp.TP_REPEATS`)."""


FULL = Budget(
    gemm_sizes=(64, 256, 1024, 4096),
    max_call_s=0.08,
    repeats=5,
    attention_seqs=(64, 128, 256, 512),
    attention_head_dims=(16, 32, 64, 128),
    collective_bytes=tuple(4**i * 4096 for i in range(7)),  # 4 KiB .. 16 MiB
    collective_repeats=25,
    gemm_budget_s=30.0,
    rounds=3,
)
QUICK = Budget(
    gemm_sizes=(64, 512, 4096),
    max_call_s=0.02,
    repeats=3,
    attention_seqs=(64, 256),
    attention_head_dims=(16, 64, 128),
    collective_bytes=(4096, 262144, 4 * 2**20),
    collective_repeats=12,
    gemm_budget_s=3.0,
    rounds=1,
    runtime_rounds=3,  # TP blocks took 13 of a --quick run's 41 s at 7 x 9 (2026-11-27)
    runtime_repeats=5,
)

GPU_GEMM_SIZES = (256, 1024, 4096, 8192)
"""GEMM grid on a GPU: its GEMMs saturate only past ~4096^3 (an 8192^3 bf16 product runs
~1.4 ms on an H100), and one under 256^3 lasts about its launch."""
GPU_ATTENTION_SEQS = (256, 1024, 4096, 16384)
"""Attention curve on a GPU, at `ATTENTION_WIDTH`: 0.07-275 dense GFLOP per call, up to a
training micro-batch's attention (a 1B Llama, 4 sequences of 2048: 137 GFLOP; larger calls
take the largest point's rate); the CPU's 64-512 tokens (0.004-0.27 GFLOP) last about a
launch there."""


def for_device(budget: Budget, device: torch.device) -> Budget:
    """`budget` with the grids sized for `device` (a GPU's kernels are measured where they do
    not last only a launch, and up to a training step's sizes)."""
    if device.type != "cuda":
        return budget
    seqs = GPU_ATTENTION_SEQS if budget.rounds > 1 else GPU_ATTENTION_SEQS[::2]
    return dataclasses.replace(budget, gemm_sizes=GPU_GEMM_SIZES, attention_seqs=seqs)


def dispatch_chains(
    dtype: torch.dtype, device: torch.device
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(a chain of `CHAIN_OPS` tiny operators, to be timed under `torch.no_grad`; the same
    chain with its backward) on one-element tensors: what `dispatch_s` times, and what
    `microbench_dispatch.DispatchSampler` times again through a calibration."""
    x = torch.ones(1, dtype=dtype, device=device)
    w = torch.ones(1, dtype=dtype, device=device, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(CHAIN_OPS):
            y = y * 1.0

    def train() -> None:
        y = w
        for _ in range(CHAIN_OPS):
            y = y * 1.0
        y.sum().backward()

    return chain, train


def dispatch_s(timer: Timer, dtype: torch.dtype, repeats: int | None = None) -> tuple[float, float]:
    """(seconds per op without autograd, seconds per op of a training step: half of one op's
    forward plus backward) on a one-element tensor: the fixed cost of an operator."""
    chain, train = dispatch_chains(dtype, timer.device)
    with torch.no_grad():
        raw = timer(chain, repeats) / CHAIN_OPS
    trained = timer(train, repeats) / (2 * CHAIN_OPS)
    return raw, trained


def copy_bytes_per_s(timer: Timer) -> float:
    """Host<->device bandwidth (CUDA: pinned host to device), or on a CPU the bandwidth of a
    plain copy (what offloading to host memory costs there)."""
    n = elementwise_bytes(timer.device) // 4
    if timer.device.type == "cuda":
        host = torch.ones(n, dtype=torch.float32).pin_memory()
        dev = torch.empty(n, dtype=torch.float32, device=timer.device)
        seconds = timer(lambda: dev.copy_(host, non_blocking=True))
        return n * 4 / seconds
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    return n * 4 / timer(lambda: dst.copy_(src))


def gemm_grid(
    timer: Timer, dtype: torch.dtype, budget: Budget, raw_s: float, pool: ColdPool
) -> GemmGrid:
    """Forward and backward GEMM rates on the grid `sizes`^3, smallest work first, operands
    from memory (`microbench_cold`: small GEMMs ran 10-40% slower so on this CPU). A GEMM
    expected to run longer than `max_call_s` (at the best rate so far), or any once the
    dtype's time budget is spent, is skipped (on every rank alike: rank 0 decides) and takes
    the rate of its largest measured neighbour below it."""
    sizes, max_call_s = budget.gemm_sizes, budget.max_call_s
    started = time.perf_counter()
    shapes = sorted(itertools.product(sizes, repeat=3), key=lambda s: s[0] * s[1] * s[2])
    fwd: dict[tuple[int, int, int], float] = {}
    bwd: dict[tuple[int, int, int], float] = {}
    best = 0.0
    for m, n, k in shapes:
        flops = 2.0 * m * n * k
        over = time.perf_counter() - started > budget.gemm_budget_s / budget.rounds
        if _agreed(over or bool(best and flops / best > max_call_s), timer):
            continue
        ops = pool.operands([(m, k), (n, k), (m, n)])  # x, the Linear's weight, dY
        f_s = timer(partial(_rotating, _gemm_forward, ops))
        b_s = timer(partial(_rotating, _gemm_backward, ops))
        fwd[(m, n, k)] = max(flops / max(f_s - raw_s, 1e-9), MIN_RATE)
        bwd[(m, n, k)] = max(2 * flops / max(b_s - 2 * raw_s, 1e-9), MIN_RATE)
        best = max(best, fwd[(m, n, k)])
    grid = [(m, n, k) for m in sizes for n in sizes for k in sizes]
    return GemmGrid(
        m=sizes,
        n=sizes,
        k=sizes,
        fwd_flops_per_s=tuple(_filled(fwd, s) for s in grid),
        bwd_flops_per_s=tuple(_filled(bwd, s) for s in grid),
    )


def _gemm_forward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """An `nn.Linear`'s forward, `x @ w^T` with the weight stored (N, K) as the Linear keeps
    it (`g` is the backward's operand, unused here). The operands' layout is the Linear's:
    on a CPU without bf16 units the emulated bf16 GEMM ran 0.9 GFLOP/s as `x @ w` with w
    stored (K, N) and 10 as the Linear's `x @ w^T` at 1024^3 (2026-11-26; fp32 within 10%
    either way), and the grid measured the former until then."""
    return torch.mm(x, w.t())


def _gemm_backward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> None:
    """The two GEMMs of that Linear's backward, as autograd dispatches them (`nn.Linear`
    with bias, 3-D input): dX = G W (M, K), both stored row-major, and dW = G^T X (N, K)
    (0.9 and 23 GFLOP/s in emulated bf16 at 1024^3 on the CPU above)."""
    torch.mm(g, w)
    torch.mm(g.t(), x)


def _agreed(flag: bool, timer: Timer) -> bool:
    """Rank 0's `flag` on every rank (ranks must skip the same measurements)."""
    if not timer.group:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=timer.device)
    dist.broadcast(t, 0)
    return bool(t.item())


def _filled(rates: dict[tuple[int, int, int], float], shape: tuple[int, int, int]) -> float:
    """The measured rate at `shape`, or the rate of the largest measured shape (most work) no
    larger in any dimension (ties: the faster). Not the fastest below: GEMM rates saturate
    with size on GPUs and MKL, but an emulated bf16 backward falls with it (this CPU, 2026-11-26:
    3.3 GFLOP/s at 256 x 64 x 64, 1.1 at 256 x 64 x 4096), and the fastest small shape then
    priced gpt-small's bf16 backward GEMMs at 5.3 GFLOP/s where they ran ~1-2."""
    if shape in rates:
        return rates[shape]
    below = [
        (s[0] * s[1] * s[2], r)
        for s, r in rates.items()
        if all(a <= b for a, b in zip(s, shape, strict=True))
    ]
    return max(below)[1] if below else min(rates.values())


def kernel_fit(
    timer: Timer, dtype_key: str, budget: Budget, done: Callable[[str], None] | None = None
) -> tuple[KernelFit, float]:
    """Everything about one dtype's kernels, and the raw per-op dispatch seconds; `done(part)`
    after each of the five parts (dispatch, bandwidth, GEMM grid, attention, operators)."""
    dtype = DTYPES[dtype_key]
    tick = done or (lambda part: None)
    raw_s, launch_s = dispatch_s(timer, dtype)
    tick("dispatch")
    bw = bandwidth_bytes_per_s(timer, dtype, raw_s)
    tick("bandwidth")
    pool = ColdPool(dtype, timer.device)
    gemm = gemm_grid(timer, dtype, budget, raw_s, pool)
    tick("GEMM grid")
    attention = attention_curve(
        timer, dtype, budget.attention_seqs, budget.attention_head_dims, pool
    )
    tick("attention")
    sizes, stream_bw = stream_curve(timer, dtype, raw_s, stream_sizes_bytes(timer.device), pool)
    special = special_rates(timer, dtype, raw_s, pool)
    del pool
    tick("operators")
    fit = KernelFit(
        launch_s=launch_s,
        elementwise_bw_bytes_per_s=bw,
        gemm=gemm,
        attention=attention,
        stream_tensor_bytes=sizes,
        stream_bw_bytes_per_s=stream_bw,
        special_rates=special,
        raw_dispatch_s=raw_s,
        page_fault_s_per_byte=page_fault_s_per_byte(timer),
    )
    return fit, raw_s


def supported(dtype_key: str, device: torch.device) -> bool:
    """Whether `device` runs matmuls in this dtype (fp16 on a CPU is emulated: skipped)."""
    if device.type == "cuda":
        return dtype_key != "bf16" or torch.cuda.is_bf16_supported()
    return dtype_key in ("fp32", "bf16")


def collectives(
    timer: Timer, budget: Budget, on_point: Callable[[], None] | None = None
) -> list[CollectivePoint]:
    """Mean seconds of each collective over the default group, per message size (bytes of
    the unsharded tensor, fp32), over `budget.rounds` rounds of all sizes: the mean of every
    call, as a training step sums dozens of collectives and pays the scheduler waits a share
    of them meet. Not the fastest round: so kept, the links fitted 2 us per step (the mean of
    one round ~0.1-0.2 ms) and 2-rank GPT-2 tiny steps measured 20-60% slower than predicted
    (2026-11-25, with the kernels' fastest rounds too)."""
    sums: dict[tuple[CollectiveKind, float], float] = {}
    for _ in range(budget.rounds):  # equal calls per round: the mean of means is the mean
        for p in _collective_round(timer, budget, on_point):
            key = (p.kind, p.nbytes)
            sums[key] = sums.get(key, 0.0) + p.seconds / budget.rounds
    world = dist.get_world_size()
    return [CollectivePoint(kind=k, ranks=world, nbytes=n, seconds=s) for (k, n), s in sums.items()]


def _collective_round(
    timer: Timer, budget: Budget, on_point: Callable[[], None] | None
) -> list[CollectivePoint]:
    """One round of `collectives`."""
    world, rank, dev = dist.get_world_size(), dist.get_rank(), timer.device
    points = []
    for nbytes in budget.collective_bytes:
        n = max(world, nbytes // 4 // world * world)
        full = torch.ones(n, device=dev)
        shard = torch.ones(n // world, device=dev)
        out = torch.empty(n, device=dev)
        calls: dict[CollectiveKind, Callable[[], object]] = {
            CollectiveKind.ALL_REDUCE: partial(dist.all_reduce, full),
            CollectiveKind.ALL_GATHER: partial(dist.all_gather_into_tensor, out, shard),
            CollectiveKind.REDUCE_SCATTER: partial(dist.reduce_scatter_tensor, shard, full),
            CollectiveKind.ALL_TO_ALL: partial(dist.all_to_all_single, out, full),
            CollectiveKind.SEND_RECV: partial(_ping, full, rank, world),
        }
        for kind, call in calls.items():
            try:
                # The mean, not the median: a training step sums dozens of collectives, and
                # on a shared host a share of calls wait a scheduler tick for their peer.
                seconds = timer(call, budget.collective_repeats, mean=True)
            except (RuntimeError, NotImplementedError):  # e.g. a backend without this one
                continue
            if kind == CollectiveKind.SEND_RECV:
                seconds /= 2  # a round trip: there and back
            points.append(CollectivePoint(kind=kind, ranks=world, nbytes=4.0 * n, seconds=seconds))
            if on_point is not None:
                on_point()
    return points


OVERLAP_BYTES = 4 * 2**20
"""All-reduce message of the overlap benchmark (a DDP gradient bucket is 25 MiB; 4 MiB keeps
it quick and still bandwidth-bound)."""


OVERLAP_ROUNDS = 5
"""Rounds of the overlap benchmark, its median kept: one round measured 0.0 to 1.0 across
calibrations of this VM (2026-11-25/26, 30 calibration files), and FSDP's price on it moves by
a tenth of a gpt-small step."""


def overlap_contention(timer: Timer) -> float:
    """How much compute slows down per second of communication run alongside it, measured:
    an all-reduce alone (t_comm), GEMMs of about the same duration alone (t_comp), and the
    all-reduce launched asynchronously while the same GEMMs run (t_both). Perfect overlap
    gives t_both = max(t_comm, t_comp): 0; none gives their sum: 1. On a CPU whose cores all
    run ranks, the backend's progress threads take the cores the compute needs."""
    buf = torch.ones(OVERLAP_BYTES // 4, device=timer.device)
    x = torch.randn(256, 256, device=timer.device)
    t_comm = timer(partial(dist.all_reduce, buf))
    one = timer(partial(torch.mm, x, x))
    count = torch.tensor([max(1.0, t_comm / max(one, 1e-9))], device=timer.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # every rank runs the same GEMMs
    n = int(count.item())

    def compute() -> None:
        for _ in range(n):
            torch.mm(x, x)

    def both() -> None:
        work = dist.all_reduce(buf, async_op=True)
        compute()
        if work is not None:  # always, with async_op=True
            work.wait()

    ratios = []
    for _ in range(OVERLAP_ROUNDS):  # each round alone, then together
        t_comp, t_both = timer(compute), timer(both)
        t_comm = timer(partial(dist.all_reduce, buf))
        hidden = min(t_comm, t_comp)
        ratios.append(min(1.0, max(0.0, (t_both - max(t_comm, t_comp)) / max(hidden, 1e-9))))
    return statistics.median(ratios)


def _ping(t: torch.Tensor, rank: int, world: int) -> None:
    """Rank 0 sends to rank 1 and gets it back (other ranks idle)."""
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        dist.send(t, 0)


def rate_summary(fit: KernelFit) -> dict[str, float]:
    """A few headline figures of a fit, for the printed table."""
    g = fit.gemm
    return {
        "gemm_peak_flops_per_s": max(g.fwd_flops_per_s),
        "gemm_small_flops_per_s": g.fwd_flops_per_s[0],
        "attention_fwd_flops_per_s": max(fit.attention.fwd_flops_per_s) if fit.attention else 0.0,
        "elementwise_bw_bytes_per_s": fit.elementwise_bw_bytes_per_s,
        "launch_s": fit.launch_s,
        "log2_grid_points": math.log2(len(g.fwd_flops_per_s)),
    }
