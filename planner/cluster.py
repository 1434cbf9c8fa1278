"""Clusters: identical accelerators grouped in nodes.

A cluster is named in one of two ways:

- a preset ``"<N>x<accelerator>"`` (case-insensitive), e.g. ``8xh100``, ``1024xa100-80gb``,
  ``2xcpu``: N GPUs of a catalog accelerator (see `paraplan.planner.hardware`), in nodes of
  `DEFAULT_GPUS_PER_NODE` GPUs (or one node of N when N is smaller), unless ``gpus_per_node``
  says otherwise;
- a cluster file, ``.json`` or ``.yaml``/``.yml``::

      name: my-cluster        # optional; default "<N>x<accelerator>"
      accelerator: h100       # a catalog name or alias
      nodes: 2                # number of nodes; also accepted as "num_nodes"
      gpus_per_node: 8
      calibration:            # optional measured figures overriding the catalog
        matmul_efficiency: 0.62
        inter_node_bw_bytes_per_s: 4.5e10
        peak_flops: {bf16: 8.0e14}

  or, as `paraplan calibrate` writes it, a measured calibration (`planner/calibration.py`:
  device, torch version, date, figures, kernel curves per dtype, collective timings), which
  also replaces the catalog's kernel model.

  Loading is strict: unknown keys, missing keys and wrong types are errors. `Cluster.to_dict`
  writes the same format (with ``num_nodes``), so a saved cluster reads back equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calibration import Calibration, calibration_from_dict, is_full_calibration
from .hardware import (
    ACCELERATORS,
    Accelerator,
    calibration_overrides,
    get_accelerator,
    with_calibration,
)
from .inputs import is_regular_file, read_document
from .jsonio import write_atomic

DEFAULT_GPUS_PER_NODE = 8
"""GPUs per node when not given: DGX/HGX baseboards (NVIDIA) and MI300X platforms hold 8."""
NVLINK_DOMAIN_GPUS = {"gb200": 72}
"""Accelerators whose NVLink domain spans more than a baseboard: the node the cost model's
intra-node link spans (`Cluster.gpus_per_node`) is the domain, an NVL72 rack's 72 GPUs (18
trays of 4 behind NVLink switches) by default; a job on 64 GPUs per rack passes
`--gpus-per-node 64` (`gpus_per_node` in a cluster file)."""

FILE_SUFFIXES: tuple[str, ...] = (".json", ".yaml", ".yml")
_PRESET = re.compile(r"(\d+)x([a-z][a-z0-9._-]*)")
_REQUIRED_KEYS = ("accelerator", "nodes", "gpus_per_node")
_ALLOWED_KEYS = ("name", "accelerator", "nodes", "num_nodes", "gpus_per_node", "calibration")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """`num_nodes` nodes of `gpus_per_node` identical accelerators each."""

    name: str
    """Display name, e.g. "8xh100"."""
    accelerator: Accelerator
    """The device in every slot, calibrated figures included."""
    num_nodes: int
    """Number of nodes (hosts); GPUs in different nodes talk over the network."""
    gpus_per_node: int
    """GPUs per node; GPUs in one node talk over the intra-node link (NVLink, xGMI, PCIe)."""
    calibration: Calibration | None = None
    """What `paraplan calibrate` measured (its figures are already in `accelerator`; its
    kernel curves price compute), or None: catalog figures."""

    def __post_init__(self) -> None:
        where = f"cluster {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"{where}: name must be a non-empty string, e.g. '8xh100'")
        if not isinstance(self.accelerator, Accelerator):
            raise ValueError(
                f"{where}: accelerator must be an Accelerator, got "
                f"{type(self.accelerator).__name__}; use get_accelerator(name)"
            )
        for field_name in ("num_nodes", "gpus_per_node"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{where}: {field_name} must be a positive integer, got {value!r}; "
                    "use 1 or more"
                )

    @property
    def num_gpus(self) -> int:
        """Total number of GPUs (ranks)."""
        return self.num_nodes * self.gpus_per_node

    def fingerprint(self) -> str:
        """Short stable digest of the name, shape and every accelerator figure (not the sources).

        Equal fingerprints mean the planner saw the same hardware; a calibration changes it.
        """
        payload = {
            "name": self.name,
            "accelerator": self.accelerator.figures(),
            "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node,
        }
        if self.calibration is not None:
            payload["calibration"] = self.calibration.to_dict()
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, readable back by `cluster_from_dict` and as a cluster file."""
        return {
            "name": self.name,
            "accelerator": self.accelerator.name,
            "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node,
            "calibration": (
                calibration_overrides(self.accelerator)
                if self.calibration is None
                else self.calibration.to_dict()
            ),
        }


def preset_names() -> list[str]:
    """One example preset per catalog accelerator (a node of 8), e.g. "8xh100"."""
    return [f"{DEFAULT_GPUS_PER_NODE}x{name}" for name in ACCELERATORS]


def make_cluster(
    accelerator: str | Accelerator,
    num_gpus: int,
    *,
    gpus_per_node: int | None = None,
    name: str | None = None,
) -> Cluster:
    """`num_gpus` GPUs split into nodes of `gpus_per_node` (default 8, or one node if fewer).

    This is what ``--gpus 1024 --gpu h100 --gpus-per-node 8`` means.
    """
    acc = get_accelerator(accelerator) if isinstance(accelerator, str) else accelerator
    label = name or f"{num_gpus}x{acc.name}"
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(
            f"cluster {label!r}: the GPU count must be a positive integer, got {num_gpus!r}; "
            "e.g. 8xh100"
        )
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise ValueError(
            f"cluster {label!r}: gpus_per_node must be a positive integer, got {gpus_per_node!r}"
        )
    default = NVLINK_DOMAIN_GPUS.get(acc.name, DEFAULT_GPUS_PER_NODE)
    per_node = gpus_per_node if gpus_per_node is not None else default
    if num_gpus <= per_node:
        return Cluster(name=label, accelerator=acc, num_nodes=1, gpus_per_node=num_gpus)
    if num_gpus % per_node:
        raise ValueError(
            f"cluster {label!r}: {num_gpus} GPUs is not a multiple of {per_node} GPUs per node; "
            f"use a multiple of {per_node} or pass --gpus-per-node"
        )
    return Cluster(
        name=label, accelerator=acc, num_nodes=num_gpus // per_node, gpus_per_node=per_node
    )


def parse_cluster(text: str, *, gpus_per_node: int | None = None) -> Cluster:
    """A cluster from a preset ``"<N>x<accelerator>"`` or a path to a .json/.yaml file."""
    if not isinstance(text, str):
        raise ValueError(f"cluster must be given as a string, got {type(text).__name__}")
    stripped = text.strip()
    if stripped.lower().endswith(FILE_SUFFIXES):
        return load_cluster_file(stripped, gpus_per_node=gpus_per_node)
    match = _PRESET.fullmatch(stripped.lower())
    if match:
        count, acc_name = match.groups()
        try:
            acc = get_accelerator(acc_name)
        except ValueError as err:
            raise ValueError(f"cluster {text!r}: {err}") from err
        return make_cluster(
            acc, int(count), gpus_per_node=gpus_per_node, name=f"{int(count)}x{acc.name}"
        )
    if stripped and is_regular_file(stripped):
        return load_cluster_file(stripped, gpus_per_node=gpus_per_node)
    raise ValueError(
        f"cluster {text!r}: expected '<N>x<accelerator>' (e.g. 8xh100, 1024xa100-80gb) or a path "
        f"to a .json/.yaml cluster file; known accelerators: {', '.join(ACCELERATORS)}"
    )


def cluster_from_dict(data: object, *, origin: str = "cluster") -> Cluster:
    """A cluster from the file format (see the module docstring); `origin` prefixes errors."""
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{origin}: expected a mapping with keys {', '.join(_REQUIRED_KEYS)}, got "
            f"{type(data).__name__}"
        )
    for key in data:
        if key not in _ALLOWED_KEYS:
            raise ValueError(
                f"{origin}: unknown key {key!r}; allowed keys are {', '.join(_ALLOWED_KEYS)}"
            )
    if "nodes" in data and "num_nodes" in data:
        raise ValueError(f"{origin}: give the node count once, as 'nodes' or 'num_nodes'")
    fields = dict(data)
    if "num_nodes" in fields:
        fields["nodes"] = fields.pop("num_nodes")
    missing = [key for key in _REQUIRED_KEYS if key not in fields]
    if missing:
        raise ValueError(
            f"{origin}: missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
            "e.g. {accelerator: h100, nodes: 2, gpus_per_node: 8}"
        )
    _expect(origin, "accelerator", fields["accelerator"], str, "a catalog name such as 'h100'")
    for key in ("nodes", "gpus_per_node"):
        _expect(origin, key, fields[key], int, "a positive integer")
    name = fields.get("name")
    if name is not None:
        _expect(origin, "name", name, str, "a string")
    calibration = fields.get("calibration")
    calibration = {} if calibration is None else calibration
    _expect(origin, "calibration", calibration, Mapping, "a mapping of field -> value")
    measured = (
        calibration_from_dict(calibration, origin=f"{origin}: calibration")
        if is_full_calibration(calibration)
        else None
    )
    try:
        figures = calibration if measured is None else measured.figures
        acc = with_calibration(get_accelerator(fields["accelerator"]), figures)
        num_gpus = fields["nodes"] * fields["gpus_per_node"]
        return Cluster(
            name=name or f"{num_gpus}x{acc.name}",
            accelerator=acc,
            num_nodes=fields["nodes"],
            gpus_per_node=fields["gpus_per_node"],
            calibration=measured,
        )
    except ValueError as err:
        raise ValueError(f"{origin}: {err}") from err


def _expect(origin: str, key: str, value: object, kind: type, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(
            f"{origin}: {key!r} must be {what}, got {value!r} ({type(value).__name__})"
        )


def load_cluster_file(path: str | os.PathLike[str], *, gpus_per_node: int | None = None) -> Cluster:
    """Read a .json or .yaml/.yml cluster file (YAML for any other suffix).

    `gpus_per_node`, when given, must agree with the file (it cannot re-shape a described
    cluster).
    """
    origin = f"cluster file '{path}'"
    hint = "pass an existing .json/.yaml file or a preset such as 8xh100"
    data = read_document(path, what="cluster file", hint=hint)  # size, depth, UTF-8, finite
    cluster = cluster_from_dict(data, origin=origin)
    if gpus_per_node is not None and gpus_per_node != cluster.gpus_per_node:
        raise ValueError(
            f"{origin} has gpus_per_node={cluster.gpus_per_node}, but gpus_per_node="
            f"{gpus_per_node} was also given; drop --gpus-per-node or edit the file"
        )
    return cluster


def save_cluster_file(cluster: Cluster, path: str | os.PathLike[str]) -> None:
    """Write `cluster.to_dict()` as JSON (.json) or YAML (.yaml/.yml), atomically."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ValueError(
            f"cluster file '{path}': unsupported suffix {suffix!r}; use one of "
            f"{', '.join(FILE_SUFFIXES)}"
        )
    data = cluster.to_dict()
    if suffix == ".json":
        text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    write_atomic(file, text)
