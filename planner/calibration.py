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
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .calibration_tp import TensorParallelDispatch
from .cost.calibrated import CalibratedKernels, KernelFit
from .cost.comm import AxisLink, CollectiveKind, Collectives
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


_NON_NEGATIVE = ("fsdp_unit_host_s", "dtensor_adamw_tensor_s", "load_average")


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
    refit_runs: int = 0
    """Run reports the refits have used in all."""
    kind_links: tuple[KindLink, ...] = ()
    """Per-collective bandwidth and step latency (empty: the link's figures for all)."""
    tensor_parallel: TensorParallelDispatch | None = None
    """DTensor's host cost (None: not measured, one rank)."""
    fsdp_unit_host_s: float = 0.0
    """Host seconds one FSDP2 unit adds per forward+backward beyond its collectives (hooks,
    copy-in/out, gradient division): the calling thread's CPU time, measured on the ranks'
    mesh (0: not measured)."""
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
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"calibration: time_scale={self.time_scale!r} must be positive")
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
        by the refitted time scale (`cost.comm.Collectives` reads them)."""
        scale = self.time_scale
        return {k.kind: (k.bw_bytes_per_s / scale, k.latency_s * scale) for k in self.kind_links}

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
    """Read the `calibration` section (strict; a file from before 2026-11-26 lacks one field)."""
    if isinstance(data, Mapping) and "host_adamw_s_per_param" not in data:
        data = {**data, "host_adamw_s_per_param": 0.0}
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
        "kind_links": tuple[KindLink, ...],
        "tensor_parallel": TensorParallelDispatch | None,
        "overlap_contention": float,
        "fsdp_unit_host_s": float,
        "dtensor_adamw_tensor_s": float,
        "host_adamw_s_per_param": float,
        "load_average": float,
    }
    for name in fields:
        raw = data[name]
        values[name] = from_json(hints[name], raw) if name in hints else raw
    values["figures"] = dict(values["figures"])
    try:
        return Calibration(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{origin}: {err}") from err


def is_full_calibration(data: Mapping[str, Any]) -> bool:
    """Whether a cluster file's `calibration` mapping is a measured calibration (it names its
    device) rather than a plain mapping of catalog figures to override."""
    return "device_name" in data


def apply_figures(accelerator: str, calibration: Calibration) -> Any:
    """The catalog accelerator with the calibration's figures."""
    return with_calibration(get_accelerator(accelerator), calibration.figures)


# ---- fits ------------------------------------------------------------------------------------
def fit_links(points: Sequence[CollectivePoint]) -> tuple[float, float]:
    """(intra-node bandwidth in bytes/s, latency in s) for which the cost model's collectives
    (`cost/comm.py`, one node) best match the measured points, in log error.

    The model's time is linear in 1/bandwidth and latency (`a / bw + b * latency`, the
    coefficients read off the model itself). The two unknowns minimize the squared error of
    log(predicted / measured): symmetric, where a relative error would count a 4x
    under-prediction (-75%) as smaller than a 2x over-prediction (+100%) and drive the
    latency to zero when some collective kinds are much faster than others (gloo's
    send/recv against its all-reduce). A log grid, refined twice around its best point."""
    if not points:
        raise ValueError("no collective measurements to fit link figures on")
    rows = []
    for p in points:
        a = collective_model_s(p, bw=1.0, lat=0.0)
        b = collective_model_s(p, bw=1e30, lat=1.0)
        rows.append((a, b, math.log(p.seconds)))

    def loss(inv_bw: float, lat: float) -> float:
        return sum((math.log(a * inv_bw + b * lat + 1e-30) - y) ** 2 for a, b, y in rows)

    lo_bw, hi_bw, lo_lat, hi_lat = -14.0, -5.0, -9.0, -1.0  # log10 of 1/bw and of latency
    best = (1e-9, 0.0)
    for _ in range(3):
        steps = 40
        grid = [
            (10 ** (lo_bw + i * (hi_bw - lo_bw) / steps), lat)
            for i in range(steps + 1)
            for lat in [0.0]
            + [10 ** (lo_lat + j * (hi_lat - lo_lat) / steps) for j in range(steps + 1)]
        ]
        best = min(grid, key=lambda x: loss(*x))
        span_bw, span_lat = (hi_bw - lo_bw) / 8, (hi_lat - lo_lat) / 8
        c_bw = math.log10(best[0])
        c_lat = math.log10(best[1]) if best[1] > 0 else lo_lat
        lo_bw, hi_bw = c_bw - span_bw, c_bw + span_bw
        lo_lat, hi_lat = c_lat - span_lat, c_lat + span_lat
    inv_bw, lat = _gauss_newton(rows, *best)
    return 1.0 / max(inv_bw, 1e-14), max(lat, 1e-9)  # the grid's fastest link at most


def _gauss_newton(
    rows: Sequence[tuple[float, float, float]], inv_bw: float, lat: float
) -> tuple[float, float]:
    """Polish the grid's best point: Gauss-Newton steps on the log residuals (kept
    non-negative; a step that does not lower the loss ends it)."""

    def loss(x0: float, x1: float) -> float:
        return sum((math.log(a * x0 + b * x1 + 1e-30) - y) ** 2 for a, b, y in rows)

    current = loss(inv_bw, lat)
    for _ in range(50):
        jaa = jab = jbb = ga = gb = 0.0
        for a, b, y in rows:
            pred = a * inv_bw + b * lat + 1e-30
            r, da, db = math.log(pred) - y, a / pred, b / pred
            jaa, jab, jbb = jaa + da * da, jab + da * db, jbb + db * db
            ga, gb = ga + da * r, gb + db * r
        det = jaa * jbb - jab * jab
        if det <= 0:
            break
        x0 = max(inv_bw - (jbb * ga - jab * gb) / det, 0.0)
        x1 = max(lat - (jaa * gb - jab * ga) / det, 0.0)
        new = loss(x0, x1)
        if new >= current:
            break
        inv_bw, lat, current = x0, x1, new
    return inv_bw, lat


def fit_kind_links(points: Sequence[CollectivePoint], bw: float) -> tuple[KindLink, ...]:
    """Each collective kind's own link, fitted on its own points in log error (`fit_links`):
    bandwidth and latency where the kind has points at two sizes or more, else its latency on
    links of `bw` (the shared fit)."""
    out = []
    for kind in CollectiveKind:
        mine = [p for p in points if p.kind == kind]
        if len({p.nbytes for p in mine}) >= 2:
            kind_bw, lat = fit_links(mine)
            out.append(KindLink(kind=kind, bw_bytes_per_s=kind_bw, latency_s=lat))
        elif mine:
            out.append(KindLink(kind=kind, bw_bytes_per_s=bw, latency_s=_latency_on(mine, bw)))
    return tuple(out)


def _latency_on(points: Sequence[CollectivePoint], bw: float) -> float:
    """The step latency that best fits `points` on links of `bw`, in log error."""
    rows = []
    for p in points:
        a = collective_model_s(p, bw=bw, lat=0.0)
        b = collective_model_s(p, bw=1e30, lat=1.0)
        rows.append((a, b, math.log(p.seconds)))

    def loss(lat: float) -> float:
        return sum((math.log(a + b * lat + 1e-30) - y) ** 2 for a, b, y in rows)

    lo, hi, best = -9.0, -1.0, 0.0
    for _ in range(3):
        grid = [0.0] + [10 ** (lo + j * (hi - lo) / 40) for j in range(41)]
        best = min(grid, key=loss)
        center = math.log10(best) if best > 0 else lo
        lo, hi = center - (hi - lo) / 8, center + (hi - lo) / 8
    return best


_TINY_LAT = 1e-30


def collective_model_s(p: CollectivePoint, *, bw: float, lat: float) -> float:
    """Seconds the cost model (`cost/comm.py`, one node) gives the measured collective `p`
    on links of `bw` bytes/s and `lat` seconds per step."""
    base = get_accelerator("cpu")
    acc = dataclasses.replace(
        base, intra_node_bw_bytes_per_s=bw, intra_node_latency_s=max(lat, _TINY_LAT)
    )
    coll = Collectives(acc)
    link = AxisLink(p.ranks, p.ranks, 1)
    if p.kind == CollectiveKind.ALL_REDUCE:
        return coll.all_reduce(p.nbytes, link)
    if p.kind == CollectiveKind.ALL_GATHER:
        return coll.all_gather(p.nbytes, link)
    if p.kind == CollectiveKind.REDUCE_SCATTER:
        return coll.reduce_scatter(p.nbytes, link)
    if p.kind == CollectiveKind.ALL_TO_ALL:
        return coll.all_to_all(p.nbytes, link)
    return coll.p2p(p.nbytes, cross_node=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSample:
    """What a refit reads from one run report."""

    step_time_s: float
    """Measured median step time."""
    predicted_step_time_s: float
    """The plan's step time."""
    peak_memory_bytes: float
    """Measured peak memory of the fullest rank."""
    predicted_memory_bytes: float
    """The plan's peak memory per device."""


def run_sample(report: Mapping[str, Any], *, origin: str) -> RunSample:
    """The figures a refit needs from a run report's JSON (`executor/report.py`)."""
    try:
        sample = RunSample(
            step_time_s=float(report["step_time_s"]),
            predicted_step_time_s=float(report["predicted_step_time_s"]),
            peak_memory_bytes=float(max(report["peak_memory_bytes"])),
            predicted_memory_bytes=float(report["predicted_memory_per_gpu_bytes"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{origin} is not a run report (missing or bad {err}); pass the JSON that "
            "train_gpt2.py --report (paraplan run) writes"
        ) from None
    values = dataclasses.astuple(sample)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{origin}: step times and memory must be positive numbers")
    return sample


BANDWIDTH_FIGURES = (
    "memory_bw_bytes_per_s",
    "intra_node_bw_bytes_per_s",
    "inter_node_bw_bytes_per_s",
    "pcie_bw_bytes_per_s",
)
"""Figures a refit divides by its time ratio (rates), as it multiplies latencies and kernel
times: every predicted second scales alike."""
LATENCY_FIGURES = ("intra_node_latency_s", "inter_node_latency_s")


def refit(
    calibration: Calibration, samples: Iterable[RunSample], *, accelerator: str
) -> Calibration:
    """The calibration refitted on run reports of a cluster of `accelerator`s: every predicted
    second (kernels, collectives, the optimizer step, the roofline) scales by the geometric
    mean of measured over predicted step time, which minimizes the mean squared log error;
    and the runtime's memory moves by the median of measured less predicted peak memory (the
    process's own footprint, which the microbenchmarks only estimate)."""
    runs = list(samples)
    if not runs:
        raise ValueError("no run reports to refit on; pass one or more report JSON files")
    ratio = math.exp(
        statistics.fmean(math.log(r.step_time_s / r.predicted_step_time_s) for r in runs)
    )
    memory_gap = statistics.median(r.peak_memory_bytes - r.predicted_memory_bytes for r in runs)
    acc = with_calibration(get_accelerator(accelerator), calibration.figures)
    figures = dict(calibration.figures)
    figures["peak_flops"] = {d: f / ratio for d, f in acc.peak_flops.items()}
    figures |= {name: getattr(acc, name) / ratio for name in BANDWIDTH_FIGURES}
    figures |= {name: getattr(acc, name) * ratio for name in LATENCY_FIGURES}
    figures["runtime_overhead_bytes"] = max(1, round(acc.runtime_overhead_bytes + memory_gap))
    return dataclasses.replace(
        calibration,
        figures=figures,
        time_scale=calibration.time_scale * ratio,
        refit_runs=calibration.refit_runs + len(runs),
    )


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
