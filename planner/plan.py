"""The plan: a typed, versioned value the planner writes and the executor reads.

This module defines the types only. `plan_io.py` reads and writes the JSON form (strict load:
the schema `schema.py` generates from these dataclasses, plus value checks); enums and the
cost model's breakdown dataclasses are stored as themselves and converted at the edge.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

from .config import Optimizer, Precision, Runtime
from .cost.estimate import Replay, TimeBreakdown
from .cost.hidden import HiddenCosts
from .cost.memory import MemoryBreakdown
from .jsonio import to_json
from .model import LatentAttention
from .strategy import MeshAxis, Recompute, Schedule, Strategy

SCHEMA_VERSION = 15
"""Bumped on any incompatible change of the plan JSON (15: `TrainInfo.mtp_layers`; 14:
`Runtime.ep_dispatch` and
`ModelInfo.routing_groups`, `routing_group_top_k`; 13: a MoE model's dense blocks, their MLP,
the shared experts and multi-head latent attention in `ModelInfo`; 12:
`ModelInfo.attention_windows`; 11:
the model's MLP and routing; 9: `Runtime.recompute_modules`; 8: `parallelism.expert_tp` and
`Runtime.ep_comm_overlap`; 7: `ModelInfo.head_dim` and `TrainInfo.runtime`; 6:
`Predicted.model_flops_per_s_per_gpu`; 5: PowerSGD, offload and asynchronous pipeline
options)."""

LAYER_RECOMPUTE: tuple[Recompute, ...] = tuple(r for r in Recompute if r != Recompute.PER_LAYER)
"""Policies a single layer can have (`per_layer` describes how a plan chose them)."""


def _pos(doc: str) -> typing.Any:
    """A positive-integer field (the schema says minimum 1)."""
    return field(metadata={"minimum": 1, "doc": doc})


def _schema(**keywords: typing.Any) -> typing.Any:
    """A field with extra JSON-schema keywords (its docstring follows it as usual)."""
    return field(metadata=keywords)


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
    head_dim: int = 0
    """Width of each attention head when set apart from hidden / heads (0: hidden / heads)."""
    ffn: int = 0
    """MLP hidden size, each expert's in a MoE block (0: not recorded, plans before version
    11; then neither are the three fields below)."""
    gated_mlp: bool = False
    """A gated MLP (SwiGLU: `ModelProfile.gated_mlp`), Megatron's `--swiglu`."""
    top_k: int = 0
    """Experts each token is routed to (0 for dense)."""
    tied_embeddings: bool = False
    """The embedding and the head share one weight."""
    attention_windows: tuple[int, ...] = ()
    """Keys each query sees in each block's attention, in block order (`LayerCost.attn_window`:
    a sliding window, 0 the whole sequence); empty when no block has a window (and in plans
    before version 12)."""
    dense_blocks: tuple[int, ...] = ()
    """Blocks without experts in a MoE model, counted from 0 (DeepSeek-V3's first 3); empty
    when every block has them, for a dense model, and in plans before version 13."""
    dense_ffn: int = 0
    """MLP hidden size of those dense blocks where it differs from the experts' `ffn`
    (`ModelProfile.dense_ffn`; 0 otherwise)."""
    shared_expert_ffn: int = 0
    """Hidden size of the shared experts every token also runs, all together (0: none)."""
    latent_attention: LatentAttention | None = None
    """Multi-head latent attention's ranks (None: plain attention, and plans before 13)."""
    routing_groups: int = 1
    """Expert groups of group-limited routing (`ModelProfile.routing_groups`; 1: not limited,
    and plans before 14)."""
    routing_group_top_k: int = 1
    """Groups each token may route to (`ModelProfile.routing_group_top_k`)."""

    @property
    def windowed(self) -> bool:
        """Whether some block's attention has a sliding window."""
        return any(self.attention_windows)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterInfo:
    """What cluster the plan is for."""

    name: str
    """Cluster name, e.g. ``8xh100``."""
    fingerprint: str
    """Digest of the cluster and accelerator figures."""
    accelerator: str
    """Accelerator catalog name."""
    num_nodes: int = _pos("Nodes.")
    gpus_per_node: int = _pos("GPUs per node.")
    num_gpus: int = _pos("Total GPUs (the world size the executor must run with).")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainInfo:
    """The training configuration planned for."""

    global_batch: int = _pos("Sequences per optimizer step.")
    seq_len: int = _pos("Tokens per sequence.")
    precision: Precision
    """Parameter precision (mixed precision keeps fp32 master weights)."""
    optimizer: Optimizer
    """Optimizer."""
    memory_headroom: float = _schema(minimum=0, exclusiveMaximum=1)
    """Fraction of device memory left free."""
    runtime: Runtime = field(default_factory=Runtime)
    """How the framework the plan was priced for runs its kernels (`frameworks.py`: paraplan's
    executor unless planned with `--runtime`); absent in older plans, which were priced for
    paraplan's executor."""
    mtp_layers: int = field(default=0, metadata={"minimum": 0})
    """Multi-token-prediction modules trained after the decoder's `ModelInfo.num_blocks`
    blocks (each a layer of the plan's chain between the last block and the head,
    `planner/mtp.py`); 0: none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """Degrees and sharding choices."""

    dp: int = _pos("Data-parallel degree.")
    tp: int = _pos("Tensor-parallel degree.")
    pp: int = _pos("Pipeline stages.")
    cp: int = _pos("Context-parallel degree.")
    ep: int = _pos(
        "Expert-parallel degree: inside dp, or with expert_tp 1 and tp > 1 over the TP ranks "
        "and ep / tp of the dp ranks."
    )
    expert_tp: int = _pos(
        "Tensor-parallel degree of the experts: tp (split as the dense layers), or 1 (each "
        "expert whole on one rank, the expert-parallel group folded over the TP ranks: "
        "Megatron-Core's expert_tensor_parallel_size, torchtitan's "
        "expert_tensor_parallel_degree)."
    )
    zero_stage: int = field(metadata={"minimum": 0, "maximum": 3, "doc": "ZeRO stage 0-3."})
    dp_shard: int = _pos(
        "Data-parallel ranks of one ZeRO-3 shard group: dp for plain FSDP, DDP and ZeRO-1/2; "
        "below dp for HSDP (zero_stage 3: shard within groups of dp_shard consecutive dp ranks, "
        "replicate across dp // dp_shard groups)."
    )
    sequence_parallel: bool
    """Megatron sequence parallelism with TP."""
    virtual_stages: int = _pos("Model chunks per pipeline rank (interleaved 1F1B).")
    offload_optimizer: bool
    """Optimizer states and step on the host."""
    powersgd_rank: int | None = field(
        default=None,
        metadata={
            "minimum": 1,
            "doc": "PowerSGD rank of DDP's gradient all-reduce (Vogels et al. 2019); null: "
            "uncompressed. It changes the training math: planned only with --allow-compression "
            "or a pin.",
        },
    )
    offload_params: bool = False
    """Parameter and gradient shards on the host (FSDP2 CPUOffloadPolicy, ZeRO-3)."""
    offload_activations: bool = False
    """Blocks' saved activations on the host (saved-tensor offload)."""
    async_pipeline: bool = False
    """PipeDream-2BW: 1F1B without the flush, weight staleness 1 (planned only with
    --allow-async or a pin)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """The device mesh: axis names from outermost to innermost and their sizes."""

    axis_order: tuple[MeshAxis, ...] = _schema(uniqueItems=True)
    """Axis names, outermost first (the last varies fastest over ranks)."""
    shape: tuple[int, ...] = _schema(items={"type": "integer", "minimum": 1})
    """Size of each axis in `axis_order`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkRange:
    """Chain layers one pipeline rank runs as one model chunk."""

    chunk: int = _schema(minimum=0)
    """Chunk position in the model (0 .. pp*virtual_stages-1)."""
    first_layer: int = _schema(minimum=0)
    """First chain index (0 is the embedding)."""
    last_layer: int = _schema(minimum=0)
    """Last chain index, inclusive."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """One pipeline rank and its chunks."""

    stage: int = _schema(minimum=0)
    """Pipeline rank."""
    chunks: tuple[ChunkRange, ...]
    """Its model chunks, in model order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerDecision:
    """Per-layer decisions."""

    index: int = _schema(minimum=0)
    """Chain index."""
    name: str
    """Layer name."""
    recompute: Recompute = field(metadata={"enum": [r.value for r in LAYER_RECOMPUTE]})
    """The layer's policy: none, selective or full (never per_layer)."""
    kept_bytes: float
    """Activation bytes the layer keeps for backward per micro-batch on its rank under this
    decision (what a checkpointed block keeps: its input)."""
    recompute_s: float
    """Forward seconds per micro-batch the decision adds in backward (0 for none)."""
    offload_activations: bool = False
    """Whether what the layer keeps for backward goes to the host and back (the plan's
    activation offload: every block; `kept_bytes` then lives on the host)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    """The cost model's predictions."""

    step_time_s: float = _schema(exclusiveMinimum=0)
    """Seconds per optimizer step."""
    tokens_per_s: float
    """Tokens per second over the cluster."""
    mfu: float = _schema(minimum=0)
    """Model FLOPs utilization (PaLM Appendix B)."""
    model_flops_per_s_per_gpu: float | None = field(default=None, metadata={"minimum": 0})
    """Model FLOPs per second per GPU: the FLOPs MFU counts per step (forward and backward of
    every layer, no recomputation), over the step time and the GPUs; MFU is this over the
    accelerator's dense peak. Null in plans written before schema version 6."""
    memory_per_gpu_bytes: float
    """Peak bytes on the fullest GPU."""
    memory_capacity_bytes: float = _schema(exclusiveMinimum=0)
    """Usable bytes per GPU (capacity less headroom)."""
    peak_stage: int = _schema(minimum=0)
    """Pipeline stage of the fullest GPU."""
    memory_breakdown: MemoryBreakdown
    """Where the peak memory goes."""
    time_breakdown: TimeBreakdown
    """Where the step time goes."""
    bubble_fraction: float = _schema(minimum=0, maximum=1)
    """Share of pipeline time in fill and drain."""
    exposed_comm_s: float
    """Communication not hidden behind compute."""
    recompute_saved_bytes: float
    """Peak memory per GPU the recompute decisions save against recomputing nothing (same
    strategy otherwise)."""
    replay: Replay
    """The same step replayed operation by operation (every stage with its own times, the
    schedule's real order): its step time and peak memory, next to the closed form above."""
    hidden_costs: HiddenCosts = field(default_factory=HiddenCosts)
    """What PowerSGD, offload and the asynchronous pipeline cost (zeros for those not taken)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunnerUp:
    """An alternative the search ranked below the plan, and why it lost."""

    parallelism: Parallelism
    """Its degrees."""
    schedule: Schedule
    """Its pipeline schedule."""
    micro_batch_size: int = _pos("Its micro-batch size.")
    recompute: Recompute
    """Its recompute policy."""
    mesh_axis_order: tuple[MeshAxis, ...] = _schema(uniqueItems=True)
    """Its mesh order, outermost first."""
    step_time_s: float
    """Its predicted step time."""
    tokens_per_s: float
    """Its predicted throughput."""
    mfu: float = _schema(minimum=0)
    """Its predicted MFU."""
    memory_per_gpu_bytes: float
    """Its predicted peak memory per GPU."""
    lost_because: str
    """Why it ranks below the plan, in words."""

    def strategy(self) -> Strategy:
        """The runner-up as a search `Strategy` (to print or pin it)."""
        return _strategy(
            self.parallelism,
            self.schedule,
            self.micro_batch_size,
            self.recompute,
            self.mesh_axis_order,
        )


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
    schedule: Schedule
    """Pipeline schedule."""
    micro_batch_size: int = _pos("Sequences per micro-batch.")
    num_microbatches: int = _pos("Micro-batches per step per data-parallel replica.")
    stages: tuple[StagePlan, ...]
    """Layer ranges of each pipeline stage."""
    recompute_policy: Recompute
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

    def strategy(self) -> Strategy:
        """The plan's choices as a search `Strategy`."""
        return _strategy(
            self.parallelism,
            self.schedule,
            self.micro_batch_size,
            self.recompute_policy,
            self.mesh.axis_order,
        )

    def short(self) -> str:
        """The plan in one line: `Strategy.short` with its micro-batches per replica and, for
        a per-layer policy, the blocks' decisions."""
        blocks = [d.recompute for d in self.layers if d.name.startswith("block")]
        return self.strategy().short(num_microbatches=self.num_microbatches, block_recompute=blocks)

    def chunk_blocks(self) -> list[int]:
        """Blocks of each pipeline chunk in model order (the embedding and the head apart)."""
        last = len(self.layers) - 1
        chunks = sorted((c for st in self.stages for c in st.chunks), key=lambda c: c.chunk)
        return [
            c.last_layer - c.first_layer + 1 - (c.first_layer == 0) - (c.last_layer == last)
            for c in chunks
        ]

    def to_dict(self) -> dict[str, typing.Any]:
        """The JSON form (`plan_io.plan_from_dict` reads it back)."""
        return to_json(self)


def _strategy(
    p: Parallelism, schedule: Schedule, mbs: int, recompute: Recompute, order: tuple[MeshAxis, ...]
) -> Strategy:
    """A plan's record of a strategy, as the search's `Strategy`."""
    return Strategy(
        dp=p.dp,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        expert_tp=1 if p.expert_tp == 1 and p.tp > 1 else None,
        zero_stage=p.zero_stage,
        dp_shard=None if p.dp_shard == p.dp else p.dp_shard,
        offload_optimizer=p.offload_optimizer,
        powersgd_rank=p.powersgd_rank,
        offload_params=p.offload_params,
        offload_activations=p.offload_activations,
        async_pipeline=p.async_pipeline,
        sequence_parallel=p.sequence_parallel,
        schedule=schedule,
        virtual_stages=p.virtual_stages,
        micro_batch_size=mbs,
        recompute=recompute,
        mesh_order=order,
    )
