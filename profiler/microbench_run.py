"""`calibrate`: start one process per local device, run the microbenchmarks on all of them at
once (`microbench.py`), and fit a `planner.calibration.Calibration` from the timings.

CPU ranks use gloo and one intra-op thread each unless OMP_NUM_THREADS says otherwise, as
torchrun starts training ranks; CUDA ranks use NCCL, one GPU each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import importlib
import os
import queue as queue_mod
import socket
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..planner.calibration import (
    Calibration,
    CollectivePoint,
    DeviceKind,
    DtypeKernels,
)
from ..planner.calibration_links import fit_kind_links, fit_links
from ..planner.calibration_tp import TensorParallelDispatch
from ..planner.cluster import Cluster
from ..planner.cost.calibrated import KernelFit
from ..planner.cost.data_parallel import OVERLAP_CONTENTION
from . import microbench as mb
from .host_memory import live_resident_bytes
from .microbench_cache import gemm_cache_bytes
from .microbench_checkpoint import checkpoint_region_cost
from .microbench_dispatch import DispatchSampler, pooled_figures, tp_at_speed, with_span_dispatch
from .microbench_host import host_adamw_s_per_param
from .microbench_machine import SteadinessProbe, device_name, machine_load
from .microbench_rounds import median_fit
from .microbench_skew import SkewSampler
from .microbench_timer import Timer
from .microbench_tp import (
    NO_FSDP,
    FsdpUnitCost,
    dtensor_adamw_tensor_s,
    fsdp_unit_cost,
    tensor_parallel_dispatch,
)
from .microbench_warm import warm_training_runtime
from .rank_errors import queued_result, rank_error

Progress = Callable[[int, int, str], None]
"""(steps done, steps in all, what was just measured)."""
RUNTIME_MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "torch.distributed.tensor.parallel",
    "torch.nn.parallel",
    "transformers",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "tqdm",
    "paraplan.executor.training",
)
"""What a paraplan training rank imports beside torch (the executor's parallel wrappers, the
Hugging Face modeling library and the layers every decoder model of it imports,
examples/train_gpt2.py): imported by each rank before its resident memory is read, when
installed (~120 MiB on CPU, `transformers` alone loads lazily). Named as strings: the
profiler does not import the executor, a rank of the calibration does."""
_JOIN_TIMEOUT_S = 600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class _RankResult:
    """What rank 0 sends back."""

    fits: tuple[tuple[str, mb.KernelFit], ...]
    copy_bytes_per_s: float
    collectives: tuple[CollectivePoint, ...]
    runtime_bytes: int
    memory_bytes: int
    threads: int
    overlap_contention: float
    tensor_parallel: TensorParallelDispatch | None
    tp_runtime_bytes: int
    fsdp_unit: FsdpUnitCost
    sync_skew_s: float
    dtensor_adamw_tensor_s: float
    host_adamw_s_per_param: float
    speed_spread: float


SKEW_ROUNDS_PER_POINT = 3
"""Rounds of the sync skew after each kernel round and at the end of a full calibration: 12 in
all over its minutes (`microbench_skew.SkewSampler`), about 14 s."""
MULTI_RANK_PARTS = ("overlap", "tensor-parallel blocks", "FSDP2 units", "sync skew", "AdamW")
"""The measurements of the executor's runtime over several ranks, after the collectives, each
a progress step (the bar stood at its end while they ran: 23 s of a 41 s `--quick` here)."""


def steps_total(budget: mb.Budget, dtypes: Sequence[str], world: int) -> int:
    """Progress steps: five per dtype and round (dispatch, bandwidth, GEMMs, attention,
    operators), one for copies, one per collective measurement and round, and over several
    ranks one per measurement of the executor's runtime (`MULTI_RANK_PARTS`)."""
    per_size = len(mb.CollectiveKind) if world > 1 else 0
    points = per_size * len(budget.collective_bytes) * budget.rounds
    runtime = len(MULTI_RANK_PARTS) if world > 1 else 0
    return 5 * len(dtypes) * budget.rounds + 1 + points + runtime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world: int,
    port: int,
    use_cuda: bool,
    quick: bool,
    dtypes: tuple[str, ...],
    out: Any,
) -> None:
    """One rank: measure, and on rank 0 put progress messages and the result on `out`."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    budget = mb.QUICK if quick else mb.FULL
    # c10d's deprecation notes on the tensor collectives FSDP2 itself still calls
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    if "OMP_NUM_THREADS" not in os.environ and world > 1 and not use_cuda:
        torch.set_num_threads(1)  # what torchrun gives each rank
    for name in RUNTIME_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", rank=rank, world_size=world, device_id=None
    )
    try:
        _measure(rank, world, device, budget, dtypes, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's finalization: gloo's worker threads can still hold work
    # whose tensors reference Python objects, and tearing them down then aborts the process
    # ("terminate called without an active exception", SIGABRT; the clean-clone CI of
    # 2026-11-26; pytorch/pytorch#179291 describes it). Rank 0's result is flushed first.
    out.close()
    out.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _measure(
    rank: int,
    world: int,
    device: torch.device,
    budget: mb.Budget,
    dtypes: tuple[str, ...],
    out: Any,
) -> None:
    budget = mb.for_device(budget, device)
    timer = Timer(device, budget.repeats, group=world > 1)
    probe = SteadinessProbe(device)  # sampled at every progress point, on every rank
    dispatch = DispatchSampler(device, dtypes)  # likewise, after the probe (its warm-up)

    def tick(label: str) -> None:
        probe.sample()
        dispatch.sample()
        if rank == 0 and label:  # "": a part one rank does not measure
            out.put(("tick", label))

    timer(lambda: torch.ones(64, device=device) * 2)  # first collective, allocator warm-up
    if device.type == "cuda":  # device memory outside torch's allocator: context, NCCL
        free, total = torch.cuda.mem_get_info(device)
        runtime = max(0, total - free - torch.cuda.memory_reserved(device))
    else:  # resident memory before any training tensor, less glibc's free heap: what a
        # training rank's memory step counts as its start (profiler.host_memory), once the
        # runtime a first step initializes lazily is there too
        warm_training_runtime()
        runtime = live_resident_bytes()
    # before any other GEMM: what each dtype's matmuls keep resident per new shape
    caches = {key: gemm_cache_bytes(mb.DTYPES[key], device) for key in dtypes}
    rounds: dict[str, list[KernelFit]] = {key: [] for key in dtypes}
    # the sync skew over the calibration's minutes: rounds after every kernel round and at the
    # end (a full calibration; --quick takes one round, at the end)
    skew = SkewSampler() if world > 1 and device.type == "cpu" else None
    for r in range(budget.rounds):  # dtypes alternate: a slow spell hits one round of one
        for key in dtypes:
            label = key if budget.rounds == 1 else f"{key} (round {r + 1}/{budget.rounds})"
            fit, _ = mb.kernel_fit(timer, key, budget, partial(_tick_part, tick, label))
            region = checkpoint_region_cost(timer, mb.DTYPES[key])
            rounds[key].append(
                dataclasses.replace(
                    fit,
                    checkpoint_region_s=region.region_s,
                    checkpoint_saved_tensor_s=region.saved_tensor_s,
                )
            )
        if skew is not None and budget.rounds > 1:
            skew.sample(SKEW_ROUNDS_PER_POINT)
    fits = []
    for key in dtypes:
        fit = dataclasses.replace(
            median_fit(rounds[key]),
            gemm_cache_init_bytes=caches[key][0],
            gemm_shape_bytes=caches[key][1],
        )
        fits.append((key, fit))
    copy = mb.copy_bytes_per_s(timer)
    tick("copies")
    # one rank has no link to measure (and a send/recv to itself never completes)
    points = mb.collectives(timer, budget, lambda: tick("collectives")) if world > 1 else []
    parts = iter(MULTI_RANK_PARTS if world > 1 else ())
    contention = mb.overlap_contention(timer) if world > 1 else OVERLAP_CONTENTION
    tick(next(parts, ""))
    # DTensor's resident runtime on a host CPU: its lazily imported modules, sharding
    # propagation caches and the code of the ops it runs, grown once by the executor's TP
    # blocks (a GPU's DTensor state is host memory, not the device's)
    gc.collect()
    held = live_resident_bytes() if device.type == "cpu" else 0
    tp_dispatch, tp_w = dispatch.during(
        lambda b: tensor_parallel_dispatch(timer, budget, b) if world > 1 else None
    )
    tick(next(parts, ""))
    gc.collect()
    tp_runtime = max(0, live_resident_bytes() - held) if held and world > 1 else 0
    fsdp, fsdp_w = dispatch.during(
        lambda b: fsdp_unit_cost(timer, budget=budget, between=b) if world > 1 else NO_FSDP
    )
    tick(next(parts, ""))
    skew_s = 0.0
    if skew is not None:
        skew.sample(SKEW_ROUNDS_PER_POINT if budget.rounds > 1 else 1)
        skew_s = skew.figure_s()
    tick(next(parts, ""))
    adamw_s, adamw_w = dispatch.during(
        lambda b: dtensor_adamw_tensor_s(timer, between=b) if world > 1 else 0.0
    )
    tick(next(parts, ""))
    # optimizer offload's host AdamW, with the threads a training rank gets (torchrun: one
    # per rank when a node runs several)
    host_adamw = 0.0
    if device.type == "cuda" and rank == 0:
        host_adamw = host_adamw_s_per_param(1 if world > 1 else torch.get_num_threads())
    sizes: list[Any] = [None] * world
    dist.all_gather_object(sizes, (runtime, tp_runtime, dispatch.samples))
    # every rank loads the same DTensor modules and caches: the least reading (one rank once
    # read 71 MB where every other calibration of the day read 4.1, 2026-11-26; not explained)
    tp_runtime = min(t for _, t, _ in sizes)
    pooled = pooled_figures([d for _, _, d in sizes])
    fits = with_span_dispatch(fits, pooled)
    # the host parts at the span's speed (microbench_dispatch): each scaled by its own samples
    tp_dispatch = tp_at_speed(tp_dispatch, dispatch.speed_ratio(tp_w, pooled))
    fsdp = fsdp.at_speed(dispatch.speed_ratio(fsdp_w, pooled))
    adamw_s *= dispatch.speed_ratio(adamw_w, pooled)
    sizes = [r for r, _, _ in sizes]
    if rank == 0:
        memory = (
            torch.cuda.get_device_properties(device).total_memory
            if device.type == "cuda"
            else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // world
        )
        result = _RankResult(
            fits=tuple(fits),
            copy_bytes_per_s=copy,
            collectives=tuple(points),
            runtime_bytes=int(max(sizes)),
            memory_bytes=int(memory),
            threads=torch.get_num_threads(),
            overlap_contention=contention,
            tensor_parallel=tp_dispatch,
            tp_runtime_bytes=tp_runtime,
            sync_skew_s=skew_s,
            fsdp_unit=fsdp,
            dtensor_adamw_tensor_s=adamw_s,
            host_adamw_s_per_param=host_adamw,
            speed_spread=probe.spread(),
        )
        out.put(("result", result))


def _tick_part(tick: Callable[[str], None], dtype: str, part: str) -> None:
    tick(f"{dtype} {part}")


def calibrate(
    cluster: Cluster,
    *,
    quick: bool = False,
    dtypes: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> Calibration:
    """Measure the local devices of `cluster`'s kind (one rank per device of a node) and fit
    a calibration for it."""
    use_cuda = cluster.accelerator.name != "cpu"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError(
            f"cluster {cluster.name!r} has {cluster.accelerator.name} GPUs but this machine has "
            "no CUDA device; calibrate on the GPU machine, or a CPU cluster such as 2xcpu here"
        )
    world = cluster.gpus_per_node
    if use_cuda:
        world = min(world, torch.cuda.device_count())
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    wanted = tuple(dtypes) if dtypes else tuple(d for d in mb.DTYPES if mb.supported(d, device))
    for key in wanted:
        if key not in mb.DTYPES:
            raise ValueError(f"unknown dtype {key!r}; use one of {', '.join(mb.DTYPES)}")
    budget = mb.QUICK if quick else mb.FULL
    load = machine_load()
    total = steps_total(budget, wanted, world)
    try:
        result = _run_ranks(world, use_cuda, quick, wanted, total, progress)
    except CalibrationRankError as err:  # once: see CalibrationRankError
        print(f"paraplan: warning: {err}; measuring again on a new port", file=sys.stderr)
        result = _run_ranks(world, use_cuda, quick, wanted, total, progress)
    return dataclasses.replace(
        _calibration(result, cluster, device, world, wanted), load_average=round(load, 2)
    )


class CalibrationRankError(RuntimeError):
    """A calibration rank failed or ended without a result; names the rank's error. A rank can
    fail for a reason outside the measurement (the free port taken by another process between
    choosing and binding it, a rank killed by the OS), so `calibrate` warns and measures again
    once; a second failure is raised."""


def _run_ranks(
    world: int,
    use_cuda: bool,
    quick: bool,
    wanted: tuple[str, ...],
    total: int,
    progress: Progress | None,
    worker: Callable[..., None] = _worker,
) -> _RankResult:
    """Start the ranks on a fresh port, forward their progress, return rank 0's result."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = mp.start_processes(
        worker,
        args=(world, _free_port(), use_cuda, quick, wanted, out),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    done, result = 0, None
    try:
        while result is None:
            try:
                kind, payload = out.get(timeout=1.0)
            except queue_mod.Empty:
                if procs.join(timeout=0.01):  # every rank ended without a result
                    break
                continue
            if kind == "tick":
                done += 1
                if progress is not None:
                    progress(min(done, total), total, str(payload))
            else:
                result = payload
        while not procs.join(timeout=_JOIN_TIMEOUT_S):
            pass
    except mp.ProcessRaisedException as err:  # the rank's traceback is its message
        _stop(procs)
        raise CalibrationRankError(f"a calibration rank failed: {rank_error(str(err))}") from None
    except mp.ProcessExitedException as err:
        _stop(procs)
        # rank 0 puts its result after the last measurement, so with a result every rank
        # finished measuring: one dying as it exits (see _worker) does not change the figures;
        # the result may still be in the queue when the exit is seen first
        result = result if result is not None else queued_result(out)
        if result is None:
            raise CalibrationRankError(f"a calibration rank failed: {err}") from None
    if result is None:
        raise CalibrationRankError("the calibration ranks ended without a result")
    return result


def _stop(procs: Any) -> None:
    """End the ranks still running after another failed (they would wait on it forever)."""
    for proc in procs.processes:
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout=10)


def _calibration(
    r: _RankResult, cluster: Cluster, device: torch.device, world: int, dtypes: tuple[str, ...]
) -> Calibration:
    fits = dict(r.fits)
    base = fits.get("fp32") or next(iter(fits.values()))
    figures: dict[str, Any] = {
        "peak_flops": {k: f.peak_gemm_flops_per_s() for k, f in fits.items()},
        "matmul_efficiency": 1.0,
        "memory_bw_bytes_per_s": base.elementwise_bw_bytes_per_s,
        "pcie_bw_bytes_per_s": r.copy_bytes_per_s,
        "memory_bytes": r.memory_bytes,
    }
    if device.type == "cpu":
        # CPU ranks report peak RSS: the runtime's own resident memory counts
        figures["runtime_overhead_bytes"] = r.runtime_bytes
    if r.collectives:
        bw, lat = fit_links(r.collectives)
        figures |= {
            "intra_node_bw_bytes_per_s": bw,
            "intra_node_latency_s": lat,
        }
        if cluster.num_nodes == 1:  # one node: nothing crosses a network
            figures |= {"inter_node_bw_bytes_per_s": bw, "inter_node_latency_s": lat}
    kinds = (
        fit_kind_links(r.collectives, figures["intra_node_bw_bytes_per_s"]) if r.collectives else ()
    )
    return Calibration(
        device_name=device_name(device),
        device_kind=DeviceKind.CUDA if device.type == "cuda" else DeviceKind.CPU,
        torch_version=str(torch.__version__),
        date=datetime.date.today().isoformat(),
        world_size=world,
        threads_per_rank=r.threads,
        figures=figures,
        dtype_kernels=tuple(DtypeKernels(dtype=k, fit=fits[k]) for k in dtypes),
        collectives=r.collectives,
        kind_links=kinds,
        overlap_contention=r.overlap_contention,
        tensor_parallel=r.tensor_parallel,
        tp_runtime_bytes=float(r.tp_runtime_bytes),
        sync_skew_s=r.sync_skew_s,
        fsdp_unit_host_s=r.fsdp_unit.unit_s,  # host CPU time: the collectives are the links'
        fsdp_tensor_host_s=r.fsdp_unit.tensor_s,
        dtensor_adamw_tensor_s=r.dtensor_adamw_tensor_s,
        host_adamw_s_per_param=r.host_adamw_s_per_param,
        speed_spread=round(r.speed_spread, 3),
    )
