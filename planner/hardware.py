"""Accelerator catalog: the per-device figures the cost model reads.

Units are the codebase's: FLOP/s, bytes, bytes/s, seconds. Every bandwidth is per GPU and per
direction (datasheets print NVLink and PCIe figures summed over both directions; we halve them).
Peak FLOP/s are dense: datasheets print tensor-core figures "with sparsity" (2:4 structured),
which are twice the dense ones. Device memory "GB" on GPU datasheets is binary (GiB): HBM and
GDDR parts come in power-of-two GiB sizes, and nvidia-smi reports e.g. 81920 MiB on an A100 80GB.

Every numeric figure names its source in `Accelerator.sources`. Figures that are not on a
datasheet (latencies, achievable GEMM efficiency, runtime overhead) are labelled "assumption"
and are meant to be replaced by measured ones through `with_calibration`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .hardware_sources import (
    _A100_DS,
    _B200_DS,
    _C2C,
    _EFF_A100,
    _EFF_B200,
    _EFF_GB200,
    _EFF_HOPPER,
    _EFF_L4,
    _EFF_MI300X,
    _EFF_V100,
    _GB200_DS,
    _H100_DS,
    _H200_DS,
    _HBM2E,
    _IB_LAT,
    _L4_DS,
    _MI300X_DS,
    _NET_400G,
    _NET_GB200,
    _NVLINK,
    _NVLINK_LAT,
    _NVLINK_STEP_S,
    _PCIE_LAT,
    _PCIE_STEP_S,
    _RDMA_STEP_S,
    _RUNTIME_OVERHEAD,
    _TCP_LAT,
    _TCP_STEP_S,
    _V100_DS,
)

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""dtype keys a `peak_flops` mapping may hold."""

NUMERIC_FIELDS: tuple[str, ...] = (
    "peak_flops",
    "memory_bytes",
    "memory_bw_bytes_per_s",
    "intra_node_bw_bytes_per_s",
    "intra_node_latency_s",
    "inter_node_bw_bytes_per_s",
    "inter_node_latency_s",
    "pcie_bw_bytes_per_s",
    "matmul_efficiency",
    "runtime_overhead_bytes",
)
"""Fields that hold figures; each needs a source, each can be calibrated."""

CALIBRATABLE_FIELDS = NUMERIC_FIELDS
CALIBRATION_SOURCE = "calibration"
HOST_ACCELERATOR = "cpu"
"""The catalog entry (and calibrated accelerator) whose devices are the host's CPUs."""
_INT_FIELDS = frozenset({"memory_bytes", "runtime_overhead_bytes"})
_GiB = 1024**3


@dataclass(frozen=True, kw_only=True, slots=True)
class Accelerator:
    """One device model and the figures the cost model needs about it (per GPU)."""

    name: str
    """Catalog key, lower case, e.g. "h100", "a100-80gb"."""
    description: str
    """Human-readable model, e.g. "NVIDIA H100 SXM5 80GB"."""
    peak_flops: Mapping[str, float]
    """Dense peak FLOP/s per dtype (keys among `DTYPES`); a dtype the device lacks is absent."""
    memory_bytes: int
    """Device memory capacity in bytes."""
    memory_bw_bytes_per_s: float
    """Device memory (HBM/GDDR) bandwidth."""
    intra_node_bw_bytes_per_s: float
    """GPU-to-GPU bandwidth inside a node (NVLink, xGMI or PCIe), per GPU, one direction."""
    intra_node_latency_s: float
    """Latency of one collective step inside a node."""
    inter_node_bw_bytes_per_s: float
    """Network bandwidth per GPU between nodes (InfiniBand/RoCE/Ethernet), one direction."""
    inter_node_latency_s: float
    """Latency of one collective step between nodes."""
    pcie_bw_bytes_per_s: float
    """Host<->device bandwidth, one direction (offload traffic)."""
    matmul_efficiency: float
    """Achievable fraction of peak for large GEMMs (an assumption until calibrated), in (0, 1]."""
    runtime_overhead_bytes: int
    """Per-process memory not available to tensors: CUDA context, library workspaces, NCCL."""
    sources: Mapping[str, str]
    """Field name -> where its figure comes from, for every field in `NUMERIC_FIELDS`."""

    @property
    def is_host(self) -> bool:
        """Whether the device is the host CPU itself (then there is no host memory apart from
        the device's to offload to; the executor runs such a plan on `cpu`)."""
        return self.name == HOST_ACCELERATOR

    def __post_init__(self) -> None:
        where = f"accelerator {self.name!r}"
        if not isinstance(self.name, str) or not self.name or self.name != self.name.lower():
            raise ValueError(f"{where}: name must be a non-empty lower-case string")
        peak = dict(self.peak_flops)
        if not peak:
            raise ValueError(f"{where}: peak_flops is empty; give one of {', '.join(DTYPES)}")
        for dtype, flops in peak.items():
            if dtype not in DTYPES:
                raise ValueError(
                    f"{where}: peak_flops has unknown dtype {dtype!r}; use one of "
                    f"{', '.join(DTYPES)}"
                )
            peak[dtype] = _check_positive(f"{where}: peak_flops[{dtype!r}]", flops)
        for name in NUMERIC_FIELDS[1:]:
            value = getattr(self, name)
            number = _check_positive(f"{where}: {name}", value)
            if name in _INT_FIELDS and not isinstance(value, int):
                raise ValueError(f"{where}: {name} must be an int number of bytes, got {value!r}")
            if name not in _INT_FIELDS:  # one JSON spelling per figure, for the fingerprint
                object.__setattr__(self, name, number)
        if self.matmul_efficiency > 1:
            raise ValueError(
                f"{where}: matmul_efficiency is a fraction of peak, got {self.matmul_efficiency}; "
                "use a value in (0, 1]"
            )
        sources = dict(self.sources)
        missing = [name for name in NUMERIC_FIELDS if not sources.get(name)]
        if missing:
            raise ValueError(f"{where}: no source for {', '.join(missing)}; cite one per figure")
        # Defensive copies: the dataclass is frozen, its mappings should not be shared.
        object.__setattr__(self, "peak_flops", peak)
        object.__setattr__(self, "sources", sources)

    def __hash__(self) -> int:  # the generated hash would fail on the dict fields
        return hash((self.name, self.memory_bytes, self.matmul_efficiency))

    def peak_flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; ValueError if this accelerator has no such figure."""
        key = dtype.lower() if isinstance(dtype, str) else dtype
        if key not in self.peak_flops:
            raise ValueError(
                f"accelerator {self.name!r} has no peak FLOP/s figure for dtype {dtype!r}; "
                f"it has {', '.join(self.peak_flops)}. Pick one of those, or calibrate it with "
                f"with_calibration(acc, {{'peak_flops': {{{dtype!r}: <FLOP/s>}}}})"
            )
        return self.peak_flops[key]

    def figures(self) -> dict[str, Any]:
        """The name and every numeric figure, JSON-able, in a canonical order (no text fields)."""
        out: dict[str, Any] = {"name": self.name}
        for name in NUMERIC_FIELDS:
            value = getattr(self, name)
            out[name] = dict(sorted(value.items())) if name == "peak_flops" else value
        return out


def _check_positive(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return float(value)


def _sources(
    datasheet: str,
    *,
    intra: str,
    intra_lat: str,
    inter: str,
    inter_lat: str,
    eff: str,
    pcie: str | None = None,
) -> dict[str, str]:
    return {
        "peak_flops": f"{datasheet}; dense figures (the 'with sparsity' tensor figures halved)",
        "memory_bytes": f"{datasheet}; device-memory GB read as GiB (binary capacity)",
        "memory_bw_bytes_per_s": datasheet,
        "intra_node_bw_bytes_per_s": intra,
        "intra_node_latency_s": intra_lat,
        "inter_node_bw_bytes_per_s": inter,
        "inter_node_latency_s": inter_lat,
        "pcie_bw_bytes_per_s": pcie or f"{datasheet}; bidirectional PCIe figure halved",
        "matmul_efficiency": eff,
        "runtime_overhead_bytes": _RUNTIME_OVERHEAD,
    }


# --- catalog ------------------------------------------------------------------------------------
# Bandwidths per GPU and direction. PCIe: Gen3 x16 16e9, Gen4 x16 32e9, Gen5 x16 64e9 B/s.
# fmt: off
_A100_COMMON: dict[str, Any] = dict(
    peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    intra_node_bw_bytes_per_s=300e9, intra_node_latency_s=_NVLINK_STEP_S,
    inter_node_bw_bytes_per_s=25e9, inter_node_latency_s=_RDMA_STEP_S,
    pcie_bw_bytes_per_s=32e9, matmul_efficiency=0.75, runtime_overhead_bytes=_GiB,
    sources=_sources(
        _A100_DS, intra=_NVLINK.format(ds=_A100_DS, bidi=600), intra_lat=_NVLINK_LAT,
        inter=("NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand "
               "for 8 GPUs -> 25 GB/s per GPU, https://www.nvidia.com/en-us/data-center/dgx-a100/"),
        inter_lat=_IB_LAT, eff=_EFF_A100,
    ),
)


def _hopper_sxm(datasheet: str, system: str, page: str) -> dict[str, Any]:
    """H100 SXM and H200 share the GH100 die, NVLink 4 and DGX networking."""
    return dict(
        peak_flops={"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12,
                    "fp8": 1978.9e12},
        intra_node_bw_bytes_per_s=450e9, intra_node_latency_s=_NVLINK_STEP_S,
        inter_node_bw_bytes_per_s=50e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=64e9, matmul_efficiency=0.70, runtime_overhead_bytes=_GiB,
        sources=_sources(
            datasheet, intra=_NVLINK.format(ds=datasheet, bidi=900), intra_lat=_NVLINK_LAT,
            inter=_NET_400G.format(system=system, page=page), inter_lat=_IB_LAT, eff=_EFF_HOPPER,
        ),
    )


def _hopper_hbm2e() -> dict[str, Any]:
    """Meta Grand Teton's lower-TDP H100 (torchtitan benchmarks/llama3_h100_202412_torchtitan.md:
    "96GB HBM2e, 500W"; 400 Gb/s RDMA per GPU); its 500 W clock loss is not published or priced."""
    out = _hopper_sxm(_H100_DS, "DGX H100", "dgx-h100")
    out["sources"] = {**out["sources"], "memory_bytes": _HBM2E, "memory_bw_bytes_per_s": _HBM2E}
    return out


_CATALOG: tuple[Accelerator, ...] = (
    Accelerator(
        name="a100-40gb", description="NVIDIA A100 SXM4 40GB",
        memory_bytes=40 * _GiB, memory_bw_bytes_per_s=1555e9, **_A100_COMMON,
    ),
    Accelerator(
        name="a100-80gb", description="NVIDIA A100 SXM4 80GB",
        memory_bytes=80 * _GiB, memory_bw_bytes_per_s=2039e9, **_A100_COMMON,
    ),
    Accelerator(
        name="h100", description="NVIDIA H100 SXM5 80GB",
        memory_bytes=80 * _GiB, memory_bw_bytes_per_s=3.35e12,
        **_hopper_sxm(_H100_DS, "DGX H100", "dgx-h100"),
    ),
    Accelerator(
        name="h100-hbm2e", description="NVIDIA H100 96GB HBM2e, 500 W (Meta Grand Teton)",
        memory_bytes=96 * _GiB, memory_bw_bytes_per_s=2.4e12, **_hopper_hbm2e(),
    ),
    Accelerator(
        name="h200", description="NVIDIA H200 SXM 141GB",
        memory_bytes=141 * _GiB, memory_bw_bytes_per_s=4.8e12,
        **_hopper_sxm(_H200_DS, "DGX H200", "dgx-h200"),
    ),
    Accelerator(
        name="h100-pcie", description="NVIDIA H100 PCIe 80GB",
        peak_flops={"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12, "fp8": 1513e12},
        memory_bytes=80 * _GiB, memory_bw_bytes_per_s=2.0e12,
        intra_node_bw_bytes_per_s=64e9, intra_node_latency_s=_PCIE_STEP_S,
        inter_node_bw_bytes_per_s=25e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=64e9, matmul_efficiency=0.70, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _H100_DS,
            intra=(f"{_H100_DS}; PCIe Gen5 x16 128 GB/s bidirectional, halved. The NVLink bridge "
                   "(600 GB/s) joins only pairs of cards, so 8-GPU collectives run over PCIe"),
            intra_lat=_PCIE_LAT,
            inter=("NVIDIA Enterprise Reference Architecture, PCIe-optimized 2-8-5-200 servers: "
                   "200 Gb/s east-west per GPU -> 25 GB/s, "
                   "https://docs.nvidia.com/ai-enterprise/reference-architecture/latest/"),
            inter_lat=_IB_LAT, eff=_EFF_HOPPER,
        ),
    ),
    Accelerator(
        name="b200", description="NVIDIA B200 (HGX B200) 180GB",
        peak_flops={"fp32": 75e12, "tf32": 1.1e15, "bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15},
        memory_bytes=180 * _GiB, memory_bw_bytes_per_s=7.7e12,
        intra_node_bw_bytes_per_s=900e9, intra_node_latency_s=_NVLINK_STEP_S,
        inter_node_bw_bytes_per_s=50e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=64e9, matmul_efficiency=0.65, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _B200_DS, intra=_NVLINK.format(ds=_B200_DS, bidi=1800), intra_lat=_NVLINK_LAT,
            inter=_NET_400G.format(system="DGX B200", page="dgx-b200"), inter_lat=_IB_LAT,
            eff=_EFF_B200,
        ),
    ),
    Accelerator(
        name="gb200", description="NVIDIA GB200 NVL72 (Blackwell GPU, 1200 W) 186GB",
        peak_flops={"fp32": 80e12, "tf32": 1.25e15, "bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15},
        memory_bytes=186 * _GiB, memory_bw_bytes_per_s=8e12,
        intra_node_bw_bytes_per_s=900e9, intra_node_latency_s=_NVLINK_STEP_S,
        inter_node_bw_bytes_per_s=50e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=225e9, matmul_efficiency=0.65, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _GB200_DS, intra=_NVLINK.format(ds=_GB200_DS, bidi=1800), intra_lat=_NVLINK_LAT,
            inter=_NET_GB200, inter_lat=_IB_LAT, eff=_EFF_GB200, pcie=_C2C,
        ),
    ),
    Accelerator(
        name="l4", description="NVIDIA L4 24GB (PCIe)",
        peak_flops={"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12,
                    "fp8": 242.5e12},
        memory_bytes=24 * _GiB, memory_bw_bytes_per_s=300e9,
        intra_node_bw_bytes_per_s=32e9, intra_node_latency_s=_PCIE_STEP_S,
        inter_node_bw_bytes_per_s=1.5625e9, inter_node_latency_s=_TCP_STEP_S,
        pcie_bw_bytes_per_s=32e9, matmul_efficiency=0.60, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _L4_DS, intra=f"{_L4_DS}; no NVLink: PCIe Gen4 x16, 64 GB/s bidirectional, halved",
            intra_lat=_PCIE_LAT,
            inter=("assumption from Google Cloud G2 machine types: g2-standard-96 (8x L4) has "
                   "100 Gb/s of network for 8 GPUs -> 1.5625 GB/s per GPU, "
                   "https://cloud.google.com/compute/docs/accelerator-optimized-machines"),
            inter_lat=_TCP_LAT, eff=_EFF_L4,
        ),
    ),
    Accelerator(
        name="v100", description="NVIDIA Tesla V100 SXM2 32GB",
        # Volta has no bf16, tf32 or fp8 units: those keys are absent on purpose.
        peak_flops={"fp32": 15.7e12, "fp16": 125e12},
        memory_bytes=32 * _GiB, memory_bw_bytes_per_s=900e9,
        intra_node_bw_bytes_per_s=150e9, intra_node_latency_s=_NVLINK_STEP_S,
        inter_node_bw_bytes_per_s=6.25e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=16e9, matmul_efficiency=0.70, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _V100_DS, intra=_NVLINK.format(ds=_V100_DS, bidi=300), intra_lat=_NVLINK_LAT,
            inter=("NVIDIA DGX-1 with V100 datasheet: 4x 100 Gb/s EDR InfiniBand for 8 GPUs "
                   "-> 6.25 GB/s per GPU, https://www.nvidia.com/en-us/data-center/dgx-1/"),
            inter_lat=_IB_LAT, eff=_EFF_V100,
            pcie=f"{_V100_DS}; PCIe Gen3 x16 32 GB/s bidirectional, halved",
        ),
    ),
    Accelerator(
        name="mi300x", description="AMD Instinct MI300X 192GB (OAM)",
        peak_flops={"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12,
                    "fp8": 2614.9e12},
        memory_bytes=192 * _GiB, memory_bw_bytes_per_s=5.3e12,
        intra_node_bw_bytes_per_s=448e9, intra_node_latency_s=_NVLINK_STEP_S,
        inter_node_bw_bytes_per_s=50e9, inter_node_latency_s=_RDMA_STEP_S,
        pcie_bw_bytes_per_s=64e9, matmul_efficiency=0.50, runtime_overhead_bytes=_GiB,
        sources=_sources(
            _MI300X_DS,
            intra=(f"{_MI300X_DS}; Infinity Fabric 896 GB/s peak aggregate (7 links x 128 GB/s "
                   "bidirectional), halved: 448 GB/s per direction summed over the 7 peers of a "
                   "fully connected 8-GPU platform (one peer link alone is 64 GB/s)"),
            intra_lat=_NVLINK_LAT,
            inter=("Microsoft Azure ND MI300X v5: 8x 400 Gb/s InfiniBand for 8 GPUs -> 50 GB/s "
                   "per GPU, https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/"
                   "gpu-accelerated/ndmi300xv5-series"),
            inter_lat=_IB_LAT, eff=_EFF_MI300X,
        ),
    ),
    Accelerator(
        name="cpu", description="Nominal CPU 'device' for tests",
        peak_flops={"fp32": 1e11, "bf16": 1e11},
        memory_bytes=16 * _GiB, memory_bw_bytes_per_s=2e10,
        intra_node_bw_bytes_per_s=1e10, intra_node_latency_s=1e-5,
        inter_node_bw_bytes_per_s=1e10, inter_node_latency_s=1e-5,
        pcie_bw_bytes_per_s=1e10, matmul_efficiency=0.5, runtime_overhead_bytes=256 * 1024**2,
        sources=dict.fromkeys(NUMERIC_FIELDS, "nominal figures for tests, not a datasheet"),
    ),
)
# fmt: on

ACCELERATORS: Mapping[str, Accelerator] = MappingProxyType({a.name: a for a in _CATALOG})
"""The catalog, by name."""

ALIASES: Mapping[str, str] = MappingProxyType({"h100-sxm": "h100", "h100-sxm5": "h100"})
"""Other accepted names -> catalog name."""


def get_accelerator(name: str) -> Accelerator:
    """The catalog entry for `name` (case-insensitive; aliases accepted)."""
    key = name.strip().lower() if isinstance(name, str) else name
    key = ALIASES.get(key, key)
    if key not in ACCELERATORS:
        raise ValueError(
            f"unknown accelerator {name!r}: known accelerators are {', '.join(ACCELERATORS)} "
            f"(aliases: {', '.join(f'{a} = {t}' for a, t in ALIASES.items())})"
        )
    return ACCELERATORS[key]


_DEVICE_NAME_WORDS: tuple[tuple[str, str], ...] = (
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100"),
    ("H200", "h200"),
    ("GB200", "gb200"),
    ("B200", "b200"),
    ("L4", "l4"),
    ("V100", "v100"),
    ("MI300X", "mi300x"),
)
"""Catalog names by the words CUDA reports in device names, most specific first (e.g.
torch.cuda.get_device_name() gives "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe" or
"NVIDIA A100-SXM4-80GB"). Matched as whole words, so an L40S is not taken for an L4."""
A100_80GB_MIN_BYTES = 60 * 2**30
"""An A100 reporting more memory than this is the 80 GB part (the 40 GB part reports 40 GiB)."""


def accelerator_for_device_name(name: str, *, memory_bytes: int | None = None) -> str | None:
    """The catalog name of a device as torch reports it (`torch.cuda.get_device_name()`), or
    None when the catalog has no such device. An A100 needs `memory_bytes` (its total memory)
    to tell the 40 GB part from the 80 GB one; without it an A100 is not identified."""

    def has(word: str) -> bool:  # `word` not inside a longer name: L4 is not L40S
        return re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", name) is not None

    if has("A100"):
        if memory_bytes is None:
            return None
        return "a100-80gb" if memory_bytes > A100_80GB_MIN_BYTES else "a100-40gb"
    return next((key for word, key in _DEVICE_NAME_WORDS if has(word)), None)


def with_calibration(acc: Accelerator, overrides: Mapping[str, Any]) -> Accelerator:
    """A copy of `acc` with measured figures; the overridden sources become "calibration".

    `overrides` maps field names in `CALIBRATABLE_FIELDS` to positive finite numbers, except
    `peak_flops`, which maps dtypes to FLOP/s and is merged into the catalog figures by dtype,
    e.g. ``{"matmul_efficiency": 0.62, "peak_flops": {"bf16": 8e14}}``.
    """
    if not isinstance(overrides, Mapping):
        raise ValueError(
            f"calibration must be a mapping of field -> value, got {type(overrides).__name__}"
        )
    changes: dict[str, Any] = {}
    sources = dict(acc.sources)
    for key, value in overrides.items():
        if key not in CALIBRATABLE_FIELDS:
            raise ValueError(
                f"calibration field {key!r} is not calibratable; calibratable fields are "
                f"{', '.join(CALIBRATABLE_FIELDS)}"
            )
        if key == "peak_flops":
            changes[key], sources[key] = _calibrated_peak(acc, value)
        else:
            whole = key in _INT_FIELDS and isinstance(value, float) and value.is_integer()
            changes[key] = int(value) if whole else value
            sources[key] = CALIBRATION_SOURCE
    try:  # Accelerator.__post_init__ checks every figure and names the bad one
        return dataclasses.replace(acc, sources=sources, **changes)
    except ValueError as err:
        raise ValueError(f"calibration rejected: {err}") from err


def _calibrated_peak(acc: Accelerator, value: object) -> tuple[dict[str, Any], str]:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            "calibration value for 'peak_flops' must be a non-empty mapping dtype -> FLOP/s, "
            f"e.g. {{'bf16': 8e14}}; got {value!r}"
        )
    calibrated = {k.lower() if isinstance(k, str) else k: f for k, f in value.items()}
    merged = {**acc.peak_flops, **calibrated}
    if set(merged) <= set(calibrated):
        return merged, CALIBRATION_SOURCE
    others = acc.sources["peak_flops"]
    return merged, f"{CALIBRATION_SOURCE} ({', '.join(map(str, calibrated))}); others: {others}"


def calibration_overrides(acc: Accelerator) -> dict[str, Any]:
    """The figures of `acc` that differ from its catalog entry, in `with_calibration` form.

    `with_calibration(get_accelerator(acc.name), calibration_overrides(acc))` has the figures
    of `acc`; `Cluster.to_dict` uses this to write a calibrated cluster back to a file.
    """
    base = get_accelerator(acc.name)
    out: dict[str, Any] = {}
    for name in NUMERIC_FIELDS:
        value, base_value = getattr(acc, name), getattr(base, name)
        if name == "peak_flops":
            changed = {d: f for d, f in value.items() if base_value.get(d) != f}
            if changed:
                out[name] = dict(sorted(changed.items()))
        elif value != base_value:
            out[name] = value
    return out
