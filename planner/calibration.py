"""A calibration: what `paraplan calibrate` measured on one machine, as the planner reads it.

It is the `calibration` section of a cluster file (`planner/cluster.py`)::

    calibration:
      device_name: AMD EPYC ...      # what was measured, with which torch, when
      device_kind: cpu               # cpu or cuda
      torch_version: 2.13.0+cpu
      date: '2025-01-31'
      world_size: 2                  # ranks measured at once (the local device count)
      threads_per_rank: 1
      figures: {memory_bw_bytes_per_s: 9.1e9, intra_node_latency_s: 6e-5, ...}
      dtype_kernels: [{dtype: fp32, fit: {launch_s: ..., gemm: {...}, ...}}, ...]
      collectives: [{kind: all_reduce, ranks: 2, nbytes: 65536, seconds: 1.2e-4}, ...]
      time_scale: 1.0                # refitted by --from-run

Loading is strict (unknown or missing keys, wrong types, non-finite numbers; the schema is
generated from these dataclasses). `figures` override the catalog's (`with_calibration`),
`dtype_kernels` its kernel model (`cost/calibrated.py`); the raw `collectives` stay for plots
and refits. No torch here: `profiler/microbench.py` measures."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .calibration_tp import TensorParallelDispatch
from .cost.calibrated import CalibratedKernels, KernelFit
from .cost.comm import CollectiveKind
from .cost.data_parallel import OVERLAP_CONTENTION
from .hardware import (
    CALIBRATABLE_FIELDS,
    accelerator_for_device_name,
    get_accelerator,
    with_calibration,
)
from .jsonio import from_json, object_schema, to_json, validate

ERROR_HINT_FRACTION = 0.20
"""A run whose step time is off by more than this fraction of the prediction should refit the
calibration (`paraplan calibrate --from-run`)."""


class DeviceKind(StrEnum):
    """What was measured."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectivePoint:
    """One measured collective."""

    kind: CollectiveKind
    """Which collective."""
    ranks: int
    """Ranks in the group."""
    nbytes: float
    """Bytes of the unsharded tensor (all-gather output, reduce-scatter input, all-reduce
    tensor, all-to-all buffer per rank, send/recv message)."""
    seconds: float
    """Mean seconds of one call (what a step that makes many of them pays)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KindLink:
    """The link one collective kind showed: its own bandwidth and step latency, fitted on its
    own points. A backend runs each kind with its own algorithm: gloo answers a send/recv in a
    fraction of its all-reduce's time, and its reduce-scatter of a 16 MiB tensor took 19-44 ms
    where its all-gather took 10-16 (2026-11-25), which neither one shared bandwidth nor a
    per-kind latency with the bandwidth fixed can show."""

    kind: CollectiveKind
    """Which collective."""
    bw_bytes_per_s: float
    """Link bandwidth inside a node this kind's times fit (the cost model's bus efficiency
    applies on top, as for the catalog's figure)."""
    latency_s: float
    """Seconds per step inside a node."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bw_bytes_per_s) and self.bw_bytes_per_s > 0):
            raise ValueError(f"{self.kind}: bw_bytes_per_s={self.bw_bytes_per_s!r} must be > 0")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"{self.kind}: latency_s={self.latency_s!r} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class DtypeKernels:
    """The kernel measurements of one dtype."""

    dtype: str
    """Dtype key, as `TrainConfig.compute_dtype` names it (fp32, bf16, fp16)."""
    fit: KernelFit
    """GEMM grid, attention curve, bandwidth and dispatch cost."""


STEADY_SPREAD = 0.10
"""A calibration whose `speed_spread` is over this is noted when planning on it: the machine
moved by more than most fidelity margins (a step-time error of 10%) while it was measured."""
_NON_NEGATIVE = (
    "tp_runtime_bytes",
    "sync_skew_s",
    "fsdp_unit_host_s",
    "fsdp_tensor_host_s",
    "dtensor_adamw_tensor_s",
    "load_average",
    "speed_spread",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Measured figures of one machine, and where and when they were measured."""

    device_name: str
    """The device as torch reports it (the CPU model, or torch.cuda.get_device_name())."""
    device_kind: DeviceKind
    """cpu or cuda."""
    torch_version: str
    """torch.__version__ of the measuring process."""
    date: str
    """ISO date (YYYY-MM-DD) of the measurement."""
    world_size: int
    """Ranks measured at once (kernels run on every rank together, as in training)."""
    threads_per_rank: int
    """Intra-op threads of each rank (torchrun's OMP_NUM_THREADS)."""
    figures: dict[str, Any]
    """Accelerator figures that override the catalog (`hardware.with_calibration` form)."""
    dtype_kernels: tuple[DtypeKernels, ...]
    """Kernel measurements per dtype."""
    collectives: tuple[CollectivePoint, ...]
    """The raw collective timings the link figures were fitted on."""
    time_scale: float = 1.0
    """Multiplier on every predicted second, refitted from run reports (1: none yet)."""
    comm_scale: float = 1.0
    """Further multiplier on the communication's seconds (the measured links and the sync
    skew), refitted from run reports whose strategies communicate in different shares
    (`calibration_refit.refit`; 1: none yet, files before 2026-11-28)."""
    optimizer_scale: float = 1.0
    """Further multiplier on the optimizer step's seconds, refitted likewise (1: none yet)."""
    refit_runs: int = 0
    """Run reports the refits have used in all."""
    kind_links: tuple[KindLink, ...] = ()
    """Per-collective bandwidth and step latency (empty: the link's figures for all)."""
    tensor_parallel: TensorParallelDispatch | None = None
    """DTensor's host cost (None: not measured, one rank)."""
    tp_runtime_bytes: float = 0.0
    """Resident bytes DTensor's tensor parallelism adds to a rank of a host CPU beyond
    `runtime_overhead_bytes`, once (its modules, propagation caches, kernels' code), measured
    across the executor's TP blocks; 0: not measured (files before 2026-11-26), a GPU (host
    memory) or one rank."""
    fsdp_unit_host_s: float = 0.0
    """Host seconds one FSDP2 unit adds per forward+backward beyond its collectives (hooks,
    copy-in/out, gradient division): the calling thread's CPU time, measured on the ranks'
    mesh (0: not measured); fixed per unit, beside `fsdp_tensor_host_s`."""
    fsdp_tensor_host_s: float = 0.0
    """And per parameter tensor of the unit (FSDP2 handles each: views of the gathered
    buffer, its sharded gradient made a DTensor); 0: not measured (files before
    2026-11-26, whose unit figure was measured on two-tensor units)."""
    sync_skew_s: float = 0.0
    """Seconds a collective waits beyond its own time when the ranks ran host work before it
    (`profiler/microbench_skew.py`), added to every collective of the calibrated cluster; 0:
    not measured (files before 2026-11-26, a GPU, one rank)."""
    load_average: float = 0.0
    """The machine's 1-minute load average when the measurement started (`os.getloadavg`; 0
    where unknown): a busy machine measures slower and less stable figures."""
    dtensor_adamw_tensor_s: float = 0.0
    """Host seconds AdamW spends per parameter tensor beyond a plain tensor's when they are
    DTensors (FSDP2, `replicate`, TP), measured on the ranks' mesh (0: not measured)."""
    host_adamw_s_per_param: float = 0.0
    """Seconds per parameter of optimizer offload's AdamW on the host, a training rank's threads
    (`profiler/microbench_host.py`); 0: not measured (a CPU calibration: the device is the host)."""
    overlap_contention: float = OVERLAP_CONTENTION
    """Seconds of compute lost per second of communication hidden behind it, measured
    (`microbench.overlap_contention`: 0 perfect overlap, 1 none); replaces the cost model's
    assumption `data_parallel.OVERLAP_CONTENTION`."""
    speed_spread: float = 0.0
    """How much this machine's speed moved while it was measured: a fixed host workload's
    90th-percentile time over its 10th, less 1, sampled at every progress point
    (`profiler/microbench_machine.py`; 0: not measured, a GPU, or files before 2026-11-28).
    A run of a few seconds averages part of it out (on a VM whose probe read 1.0, one plan's
    two runs minutes apart differed by up to 43%); `paraplan plan` notes it where it is large."""

    def __post_init__(self) -> None:
        for name in (*_NON_NEGATIVE, "host_adamw_s_per_param"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"calibration: {name}={value!r} must be >= 0")
        if not (math.isfinite(self.overlap_contention) and 0 <= self.overlap_contention <= 1):
            raise ValueError(
                f"calibration: overlap_contention={self.overlap_contention!r} must be in [0, 1]"
            )
        for name in ("world_size", "threads_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"calibration: {name}={value!r} must be a positive integer")
        for name in ("time_scale", "comm_scale", "optimizer_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"calibration: {name}={value!r} must be positive")
        dtypes = [k.dtype for k in self.dtype_kernels]
        if len(set(dtypes)) != len(dtypes):
            raise ValueError(f"calibration: kernels list a dtype twice ({dtypes}); keep one each")
        for key in self.figures:
            if key not in CALIBRATABLE_FIELDS:
                raise ValueError(
                    f"calibration figure {key!r} is not calibratable; use one of "
                    f"{', '.join(CALIBRATABLE_FIELDS)}"
                )

    def kind_link_figures(self) -> dict[CollectiveKind, tuple[float, float]]:
        """Measured (bandwidth in bytes/s, step latency in s) by collective kind, both scaled
        by the refitted time and communication scales (`cost.comm.Collectives` reads them)."""
        scale = self.time_scale * self.comm_scale
        return {k.kind: (k.bw_bytes_per_s / scale, k.latency_s * scale) for k in self.kind_links}

    @property
    def skew_s(self) -> float:
        """`sync_skew_s` scaled by the refitted time and communication scales."""
        return self.sync_skew_s * self.time_scale * self.comm_scale

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Dtypes with kernel measurements."""
        return tuple(k.dtype for k in self.dtype_kernels)

    def kernels(self, dtype: str) -> CalibratedKernels:
        """The measured kernel model for `dtype` (`compute.Kernels`)."""
        for entry in self.dtype_kernels:
            if entry.dtype == dtype:
                return CalibratedKernels(
                    entry.fit,
                    time_scale=self.time_scale,
                    async_launch=self.device_kind == DeviceKind.CUDA,
                )
        raise ValueError(
            f"the calibration has no {dtype} kernels (measured: {', '.join(self.dtypes)}); "
            f"re-run paraplan calibrate on a device with {dtype}, or plan in "
            f"{' or '.join(self.dtypes)}"
        )

    def catalog_name(self) -> str | None:
        """The catalog accelerator the measured device is (cpu, h100, ...), None when the
        catalog has no such device."""
        if self.device_kind == DeviceKind.CPU:
            return "cpu"
        return accelerator_for_device_name(self.device_name)

    def device_mismatch(self, accelerator: str) -> str | None:
        """A warning when the calibration was measured on another kind of device than the
        cluster's `accelerator`, else None."""
        measured = self.catalog_name()
        if measured == accelerator:
            return None
        return (
            f"the calibration was measured on {self.device_name!r} ({self.device_kind}, "
            f"{measured or 'not in the catalog'}), but the cluster's accelerator is "
            f"{accelerator!r}: its kernel and link figures describe the other device; "
            "run paraplan calibrate on the target machine"
        )

    def unsteady_note(self) -> str | None:
        """What `paraplan plan` says of a calibration measured while the machine's speed moved
        more than `STEADY_SPREAD` (`speed_spread`), else None."""
        if self.speed_spread <= STEADY_SPREAD:
            return None
        return (
            f"this machine's speed moved while it was calibrated ({self.device_name}, "
            f"{self.date}): a fixed host workload took up to {self.speed_spread:.0%} longer "
            "in its slow tenth than in its fast tenth; a run here is timed on a moving "
            "machine and can miss the prediction, and another run, by tens of percent: "
            "compare the median of several runs (`paraplan calibrate --from-run` refits "
            "from their reports)"
        )

    def to_dict(self) -> dict[str, Any]:
        """The `calibration` section of a cluster file."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if f.name == "figures" else to_json(value)
        return out


@functools.cache
def calibration_schema() -> dict[str, Any]:
    """Strict JSON schema of the section, generated from the dataclasses (on first use: it
    reads their source for the field docs, ~60 ms, which no plan without a calibration pays)."""
    return object_schema(Calibration, {"figures": {"type": "object"}})


def calibration_from_dict(data: object, *, origin: str = "calibration") -> Calibration:
    """Read the `calibration` section (strict; files from before 2026-11-26 lack the fields
    filled in here, and those from before 2026-11-29 the TP loss's, read as not measured)."""
    if isinstance(data, Mapping):
        data = {
            "host_adamw_s_per_param": 0.0,
            "fsdp_tensor_host_s": 0.0,
            "tp_runtime_bytes": 0.0,
            "sync_skew_s": 0.0,
            "comm_scale": 1.0,
            "optimizer_scale": 1.0,
            "speed_spread": 0.0,
            **data,
        }
        if isinstance(data.get("dtype_kernels"), list):
            data["dtype_kernels"] = [_with_saved_tensor_s(d) for d in data["dtype_kernels"]]
        tp = data.get("tensor_parallel")
        if isinstance(tp, Mapping):  # files from before 2026-11-29: the loss not measured
            data["tensor_parallel"] = {"loss_fwd_s": 0.0, "loss_bwd_s": 0.0, **tp}
    validate(data, calibration_schema(), origin, fix="re-run paraplan calibrate or fix the file")
    if not isinstance(data, Mapping):  # the schema says object; kept for the type checker
        raise ValueError(f"{origin}: must be a mapping of calibration fields")
    fields = {f.name: f for f in dataclasses.fields(Calibration)}
    values: dict[str, Any] = {}
    hints = {
        "device_kind": DeviceKind,
        "dtype_kernels": tuple[DtypeKernels, ...],
        "collectives": tuple[CollectivePoint, ...],
        "time_scale": float,
        "comm_scale": float,
        "optimizer_scale": float,
        "kind_links": tuple[KindLink, ...],
        "tensor_parallel": TensorParallelDispatch | None,
        "tp_runtime_bytes": float,
        "sync_skew_s": float,
        "overlap_contention": float,
        "fsdp_unit_host_s": float,
        "fsdp_tensor_host_s": float,
        "dtensor_adamw_tensor_s": float,
        "host_adamw_s_per_param": float,
        "load_average": float,
        "speed_spread": float,
    }
    for name in fields:
        raw = data[name]
        values[name] = from_json(hints[name], raw) if name in hints else raw
    values["figures"] = dict(values["figures"])
    try:
        return Calibration(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{origin}: {err}") from err


def _with_saved_tensor_s(entry: Any) -> Any:
    fit = entry.get("fit") if isinstance(entry, Mapping) else None
    if not isinstance(fit, Mapping) or "checkpoint_saved_tensor_s" in fit:
        return entry
    return {**entry, "fit": {**fit, "checkpoint_saved_tensor_s": 0.0}}


def is_full_calibration(data: Mapping[str, Any]) -> bool:
    """Whether a cluster file's `calibration` mapping is a measured calibration (it names its
    device) rather than a plain mapping of catalog figures to override."""
    return "device_name" in data


def apply_figures(accelerator: str, calibration: Calibration) -> Any:
    """The catalog accelerator with the calibration's figures."""
    return with_calibration(get_accelerator(accelerator), calibration.figures)


def recalibrate_hint(rel_err: float | None, cluster: str | None = None) -> str | None:
    """The run report's advice when its step time is off by more than `ERROR_HINT_FRACTION`;
    `cluster` is the plan's cluster name (a preset such as 2xcpu)."""
    if rel_err is None or abs(rel_err) <= ERROR_HINT_FRACTION:
        return None
    preset = cluster or "<N>x<device>"
    return (
        f"step time is off by {rel_err:+.0%} (more than {ERROR_HINT_FRACTION:.0%}): measure "
        f"this machine with `paraplan calibrate --cluster {preset} -o cal.yaml` and plan with "
        "--cluster cal.yaml; with a calibrated cluster, refit it from this run's report: "
        "`paraplan calibrate --from-run report.json --cluster cal.yaml -o cal.yaml`"
    )
