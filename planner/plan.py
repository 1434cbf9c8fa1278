"""The plan: a typed, versioned value the planner writes and the executor reads.

`Plan.to_dict` / `Plan.from_dict` convert to the JSON form described by
`docs/plan.schema.json` (generated from these dataclasses by `schema.py`); `save_plan` writes
atomically and `load_plan` validates strictly (unknown keys rejected) before building the value.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass, field

from .jsonio import from_json, read_json, to_json, write_atomic

SCHEMA_VERSION = 2
"""Bumped on any incompatible change of the plan JSON."""


def _pos(doc: str) -> typing.Any:
    """A positive-integer field (the schema says minimum 1)."""
    return field(metadata={"minimum": 1, "doc": doc})


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelInfo:
    """What model the plan is for."""

    name: str
    """Model name."""
    fingerprint: str
    """Digest of the model profile the plan was made from."""
    num_params: int
    """Parameter count."""
    num_blocks: int
    """Repeated blocks (the chain also has an embedding and a head)."""
    hidden: int
    """Model width."""
    heads: int
    """Attention heads."""
    kv_heads: int
    """Key/value heads."""
    vocab: int
    """Vocabulary size."""
    experts: int
    """MoE experts per block (0 for dense)."""
    module_digest: str
    """Digest of the traced module's parameter names and shapes ('' when planned from an
    analytic spec); the executor refuses a module whose digest differs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterInfo:
    """What cluster the plan is for."""

    name: str
    """Cluster name, e.g. ``8xh100``."""
    fingerprint: str
    """Digest of the cluster and accelerator figures."""
    accelerator: str
    """Accelerator catalog name."""
    num_nodes: int
    """Nodes."""
    gpus_per_node: int
    """GPUs per node."""
    num_gpus: int
    """Total GPUs (the world size the executor must run with)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainInfo:
    """The training configuration planned for."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    precision: str
    """fp32, bf16 or fp16 (mixed precision keeps fp32 master weights)."""
    optimizer: str
    """adamw, sgd, adafactor or adam8bit."""
    memory_headroom: float
    """Fraction of device memory left free."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """Degrees and sharding choices."""

    dp: int = _pos("Data-parallel degree.")
    tp: int = _pos("Tensor-parallel degree.")
    pp: int = _pos("Pipeline stages.")
    cp: int = _pos("Context-parallel degree.")
    ep: int = _pos("Expert-parallel degree (inside dp).")
    zero_stage: int = field(metadata={"minimum": 0, "maximum": 3, "doc": "ZeRO stage 0-3."})
    sequence_parallel: bool
    """Megatron sequence parallelism with TP."""
    virtual_stages: int = _pos("Model chunks per pipeline rank (interleaved 1F1B).")
    offload_optimizer: bool
    """Optimizer states and step on the host."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """The device mesh: axis names from outermost to innermost and their sizes."""

    axis_order: tuple[str, ...]
    """Axis names, outermost first (the last varies fastest over ranks)."""
    shape: tuple[int, ...]
    """Size of each axis in `axis_order`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkRange:
    """Chain layers one pipeline rank runs as one model chunk."""

    chunk: int
    """Chunk position in the model (0 .. pp*virtual_stages-1)."""
    first_layer: int
    """First chain index (0 is the embedding)."""
    last_layer: int
    """Last chain index, inclusive."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """One pipeline rank and its chunks."""

    stage: int
    """Pipeline rank."""
    chunks: tuple[ChunkRange, ...]
    """Its model chunks, in model order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerDecision:
    """Per-layer decisions."""

    index: int
    """Chain index."""
    name: str
    """Layer name."""
    recompute: str
    """none, selective or full."""
    kept_bytes: float
    """Activation bytes the layer keeps for backward per micro-batch on its rank under this
    decision (what a checkpointed block keeps: its input)."""
    recompute_s: float
    """Forward seconds per micro-batch the decision adds in backward (0 for none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdownJSON:
    """Bytes per GPU at the peak, by holder."""

    params_bytes: float
    """Working parameters."""
    grads_bytes: float
    """Gradients."""
    optimizer_bytes: float
    """Optimizer states and master weights."""
    activations_bytes: float
    """Saved activations of every in-flight micro-batch."""
    other_bytes: float
    """Runtime context and communication buffers."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdownJSON:
    """Seconds per step by cause, on the bounding pipeline stage."""

    compute_s: float
    """Forward and backward compute."""
    recompute_s: float
    """Recomputation."""
    comm_s: float
    """Exposed communication."""
    bubble_s: float
    """Pipeline fill and drain."""
    optimizer_s: float
    """Optimizer step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    """The cost model's predictions."""

    step_time_s: float
    """Seconds per optimizer step."""
    tokens_per_s: float
    """Tokens per second over the cluster."""
    mfu: float
    """Model FLOPs utilization (PaLM Appendix B)."""
    memory_per_gpu_bytes: float
    """Peak bytes on the fullest GPU."""
    memory_capacity_bytes: float
    """Usable bytes per GPU (capacity less headroom)."""
    peak_stage: int
    """Pipeline stage of the fullest GPU."""
    memory_breakdown: MemoryBreakdownJSON
    """Where the peak memory goes."""
    time_breakdown: TimeBreakdownJSON
    """Where the step time goes."""
    bubble_fraction: float
    """Share of pipeline time in fill and drain."""
    exposed_comm_s: float
    """Communication not hidden behind compute."""
    recompute_saved_bytes: float
    """Peak memory per GPU the recompute decisions save against recomputing nothing (same
    strategy otherwise)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunnerUp:
    """An alternative the search ranked below the plan, and why it lost."""

    parallelism: Parallelism
    """Its degrees."""
    schedule: str
    """Its pipeline schedule."""
    micro_batch_size: int
    """Its micro-batch size."""
    recompute: str
    """Its recompute policy (none, selective, full or per_layer)."""
    mesh_axis_order: tuple[str, ...]
    """Its mesh order, outermost first."""
    step_time_s: float
    """Its predicted step time."""
    tokens_per_s: float
    """Its predicted throughput."""
    mfu: float
    """Its predicted MFU."""
    memory_per_gpu_bytes: float
    """Its predicted peak memory per GPU."""
    lost_because: str
    """Why it ranks below the plan, in words."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A parallelization plan with its predictions."""

    schema_version: int
    """Version of this format (`SCHEMA_VERSION`)."""
    generator: str
    """Tool and version that wrote it."""
    model: ModelInfo
    """The model."""
    cluster: ClusterInfo
    """The cluster."""
    train: TrainInfo
    """The training configuration."""
    parallelism: Parallelism
    """Degrees and sharding."""
    mesh: Mesh
    """Device mesh layout."""
    schedule: str
    """Pipeline schedule: none, gpipe, 1f1b or interleaved_1f1b."""
    micro_batch_size: int = _pos("Sequences per micro-batch.")
    num_microbatches: int = _pos("Micro-batches per step per data-parallel replica.")
    stages: tuple[StagePlan, ...]
    """Layer ranges of each pipeline stage."""
    recompute_policy: str
    """How the per-layer decisions were made: uniform none, selective or full, or per_layer
    (chosen per stage by the recompute solver: the least recomputation that fits)."""
    layers: tuple[LayerDecision, ...]
    """Per-layer decisions, in chain order."""
    feasible: bool
    """Whether the predicted peak memory fits."""
    infeasible_reason: str
    """Why not, when it does not fit ('' otherwise)."""
    predicted: Predicted
    """Predictions."""
    runners_up: tuple[RunnerUp, ...]
    """The next-best strategies, best first."""

    def to_dict(self) -> dict[str, typing.Any]:
        """The JSON form."""
        return to_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, typing.Any]) -> Plan:
        """Validate against the schema and build (ValueError on any problem)."""
        from .schema import validate_plan_dict

        validate_plan_dict(data)
        return from_json(cls, data)


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON atomically (a reader never sees a half-written plan)."""
    write_atomic(path, json.dumps(plan.to_dict(), indent=2) + "\n")


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and strictly validate a plan JSON file."""
    data = read_json(path, "plan", "write one with paraplan plan -o")
    try:
        return Plan.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"plan file {str(path)!r}: {exc}") from None
