"""The planner's view of a model: a chain of layers with their costs.

Both the analytic transformer spec (`model_spec`) and the profiler (from a real `nn.Module`)
produce a `ModelProfile`; the cost model reads nothing else. Every per-layer figure is for ONE
sequence of `seq_len` tokens (batch 1) at the profile's activation dtype; the cost model scales
by the micro-batch size (all terms are linear in the batch) and divides by the parallel degrees.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from enum import StrEnum


class LayerKind(StrEnum):
    """Where a layer sits in the chain; the pipeline puts embedding first and head last."""

    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


@dataclass(frozen=True, kw_only=True, slots=True)
class OpElements:
    """Output elements of one compute-heavy elementwise operator (a transcendental: tanh, exp,
    erf, sigmoid, ...), which a CPU runs far below its memory bandwidth."""

    op: str
    """The aten overload packet, e.g. ``aten.tanh``."""
    elems: float
    """Output elements per sequence."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """Costs of one layer of the chain, per sequence of `ModelProfile.seq_len` tokens."""

    name: str
    """Layer name, e.g. ``"embedding"``, ``"block.0"``, ``"head"``."""
    kind: LayerKind
    """Embedding, repeated block, or head."""
    params: int
    """Parameters held by this layer that every tensor-parallel rank shards (dense params)."""
    expert_params: int = 0
    """Parameters in MoE experts (sharded by expert parallelism as well as TP)."""
    fwd_flops: float
    """Forward FLOPs (matmul-like ops, 2 per multiply-add) for one sequence."""
    bwd_flops: float
    """Backward FLOPs for one sequence (input and weight gradients)."""
    attn_core_fwd_flops: float = 0.0
    """Part of `fwd_flops` in the attention core (QK^T and AV): what selective recompute redoes."""
    attn_window: int = 0
    """Keys each query of the block's attention sees when it has a sliding window shorter than
    the sequence (itself and the w - 1 before it, Hugging Face's `sliding_window`), its core
    FLOPs counted over that band (`attention_pairs`); 0: the whole sequence."""
    act_tp_bytes: float
    """Bytes saved for backward that tensor parallelism shards (Korthikanti et al. 2022 §4.1)."""
    act_replicated_bytes: float
    """Bytes saved for backward that TP replicates and only sequence parallelism shards."""
    act_attn_core_bytes: float = 0.0
    """Part of `act_tp_bytes` in the attention core, dropped by selective recompute (§5)."""
    act_norm_copy_bytes: float = 0.0
    """Part of `act_replicated_bytes` an unfused RMSNorm keeps beside its input: the normalized
    hidden state x * rsqrt(mean(x^2)) for the weight multiply (eager torch, Hugging Face). A
    fused norm keeps its input and per-token statistics only (`Runtime.norm_keeps_input_only`)."""
    act_glu_copy_bytes: float = 0.0
    """Part of `act_tp_bytes` an eager gated MLP keeps beyond its input and output: silu(gate),
    saved by the multiply (each routed copy for experts). A fused SwiGLU keeps its input (gate
    and up) and recomputes it in backward (`Runtime.glu_keeps_input_only`)."""
    input_bytes: float
    """Bytes of the layer's input: all that full recompute keeps (Korthikanti §5)."""
    output_bytes: float
    """Bytes of the layer's output (pipeline p2p message when a stage ends here)."""
    fwd_tmp_bytes: float = 0.0
    """Peak transient bytes inside the forward, above what the layer keeps (profiled)."""
    bwd_tmp_bytes: float = 0.0
    """Peak transient bytes inside the backward, above what persists (profiled). The
    embedding's alone is per micro-batch, not per sequence: its backward writes its tables'
    dense gradients (and, tied, their sum with the head's), weight-sized whatever the batch
    (profile schema 5; `cost/memory.step_tmp_bytes`)."""
    fwd_time_s: float | None = None
    """Measured forward seconds per sequence on `ModelProfile.measured_on` (None: roofline)."""
    bwd_time_s: float | None = None
    """Measured backward seconds per sequence (None: roofline)."""
    fwd_ops: int = 0
    """Aten operators the traced forward dispatched for the whole traced batch, views
    included: each pays the per-operator dispatch cost (0: not traced)."""
    bwd_ops: int = 0
    """Aten operators of the traced backward (0: not traced)."""
    fwd_stream_bytes: float = 0.0
    """Bytes per sequence the forward's memory-bound operators read and write: every op
    without FLOPs that allocates its output (views excluded), transcendentals apart."""
    bwd_stream_bytes: float = 0.0
    """The same in backward."""
    fwd_written_bytes: float = 0.0
    """Of those bytes and the transcendentals', the bytes written to freshly allocated
    outputs, per sequence (in-place results excluded): on a CPU, an output at or past the C
    allocator's mmap threshold page-faults on first touch (`cost/calibrated.py`)."""
    bwd_written_bytes: float = 0.0
    """The same in backward."""
    fwd_special: tuple[OpElements, ...] = ()
    """Transcendental operators of the forward, with their output elements per sequence."""
    bwd_special: tuple[OpElements, ...] = ()
    """The same in backward."""
    param_tensors: int = 0
    """Parameter tensors first used by the layer (an unfused optimizer steps each one)."""
    param_tensor_sizes: tuple[int, ...] = ()
    """Elements of each of those tensors, in the order the forward first uses them (empty:
    not traced); torch DDP fills its gradient buckets tensor by tensor."""
    saved_tensors: int = 0
    """Tensors autograd saves for backward in the layer's forward, parameters and repeats
    included (0: not traced). A fully recomputed block pays an activation checkpoint's pack
    and unpack hooks on each (`KernelFit.checkpoint_saved_tensor_s`)."""
    autocast_saved_bytes: float | None = None
    """Bytes per sequence autograd keeps for backward when the layer runs under torch.autocast
    (bf16) over fp32 weights, the weights' low-precision copies left out
    (`profiler/autocast_trace.py`); None: not traced."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfiledOp:
    """One operator of a layer's forward, for rematerialization solvers."""

    op: str
    """The aten operator, e.g. ``aten.mm.default``."""
    inputs: tuple[int, ...]
    """Producers of its tensor inputs: node indices in the same graph, -1 for the layer input,
    -2 for parameters and other tensors from outside the layer."""
    output_bytes: float
    """Bytes of the new tensors it produces (views and in-place ops produce none), per
    sequence."""
    fwd_flops: float
    """Its FLOPs per sequence."""
    saved: bool
    """Whether autograd keeps its output for the backward pass."""
    bwd_reads: tuple[int, ...] = ()
    """The tensors its own backward reads, by producer as in `inputs` (its own index: its
    output, e.g. a softmax's); parameters (-2) are listed but are not activations."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerGraph:
    """The op-level graph of one layer's forward."""

    layer: int
    """Index of the layer in the chain."""
    nodes: tuple[ProfiledOp, ...]
    """Operators in execution order."""
    output: int = -1
    """The node producing the layer's output, the next layer's input (-1: the layer passes its
    input through, or the head, whose output is the loss)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LatentAttention:
    """Multi-head latent attention's low-rank projections (DeepSeek-V2/V3: Hugging Face's
    `q_lora_rank`, `kv_lora_rank`, `qk_rope_head_dim`, `v_head_dim`; Megatron-Core's
    `MLATransformerConfig`). The query and key heads are `ModelProfile.head_dim` wide, of which
    `qk_rope_head_dim` carry the rotary part."""

    q_lora_rank: int
    """Rank of the queries' down-projection (0: queries projected at full rank)."""
    kv_lora_rank: int
    """Rank of the compressed keys and values every head expands from."""
    qk_rope_head_dim: int
    """Rotary part of each query and key head."""
    v_head_dim: int
    """Width of each value head."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelProfile:
    """A model as the planner sees it: shape facts plus the layer chain."""

    name: str
    """Human name, e.g. ``"llama3-8b"``."""
    layers: tuple[LayerCost, ...]
    """The chain: embedding, blocks, head, in execution order."""
    seq_len: int
    """Tokens per sequence the per-layer figures are for."""
    act_dtype_bytes: int
    """Bytes per activation element the figures assume (2 for bf16)."""
    hidden: int
    """Model width (bytes of TP/PP messages scale with it)."""
    heads: int
    """Attention heads (TP must divide them)."""
    kv_heads: int
    """Key/value heads (GQA); TP either divides them or replicates them."""
    ffn: int
    """MLP inner size (TP must divide it); for MoE the expert inner size."""
    vocab: int
    """Vocabulary size."""
    experts: int = 0
    """Number of MoE experts per block (0 for a dense model)."""
    top_k: int = 0
    """Experts each token is routed to."""
    tied_embeddings: bool = False
    """Whether the head reuses the embedding matrix (a PP>1 plan keeps a copy on both ends)."""
    head_dim: int = 0
    """Width of each attention head; 0 means hidden / heads (Qwen3, Gemma and GPT-OSS set it
    apart from the hidden size: `head_size`)."""
    module_digest: str = ""
    """Digest of the traced module's parameter names and shapes ('' for an analytic spec): the
    executor checks the module it is given against it."""
    measured_on: str = ""
    """Accelerator catalog name the layer times were measured on ('' when not measured)."""
    op_graphs: tuple[LayerGraph, ...] = ()
    """Op-level graphs of representative layers (a traced profile; empty for a spec)."""
    dense_ffn: int = 0
    """MLP inner size of a MoE model's blocks without experts where the config sets it apart
    from the experts' `ffn` (DeepSeek's first blocks, Qwen-MoE's `mlp_only_layers`); 0
    otherwise. Which blocks those are: the blocks without `LayerCost.expert_params`."""
    shared_expert_ffn: int = 0
    """Inner size of the shared experts every token of a MoE block also runs, all of them
    together (DeepSeek's n_shared_experts x moe_intermediate_size, Qwen2-MoE's
    shared_expert_intermediate_size); 0 without."""
    latent_attention: LatentAttention | None = None
    """The attention's low-rank projections under multi-head latent attention (None: plain
    multi-head or grouped-query attention)."""
    routing_groups: int = 1
    """Expert groups of group-limited routing, consecutive experts each (DeepSeek-V2/V3's
    `n_group`, Megatron-Core's `moe_router_num_groups`; 1: not limited): a token routes to
    `routing_group_top_k` groups only (`cost/routing.py`)."""
    routing_group_top_k: int = 1
    """Groups each token may route to (DeepSeek's `topk_group`, Megatron-Core's
    `moe_router_group_topk`)."""
    mtp_modules: int = 0
    """Multi-token-prediction modules the model declares (DeepSeek-V3's
    `num_nextn_predict_layers`, transformers' `num_mtp_layers`): what a trainer may train
    beside the blocks (`planner/mtp.py`); 0: none."""
    mtp_blocks: int = 0
    """Of the chain's blocks, the last `mtp_blocks` are multi-token-prediction modules being
    trained (`mtp.with_mtp`; each a block with its own projection and norms, its head pass
    counted in the head's work); 0: the chain is the decoder alone."""

    def __post_init__(self) -> None:
        kinds = [layer.kind for layer in self.layers]
        if not kinds or kinds[0] != LayerKind.EMBEDDING or kinds[-1] != LayerKind.HEAD:
            raise ValueError(
                f"model {self.name!r}: the layer chain must start with an embedding and end with "
                f"a head, got {[str(k) for k in kinds[:1]]}...{[str(k) for k in kinds[-1:]]}; "
                "build the chain as (embedding, blocks..., head)"
            )
        if self.num_blocks < 1:
            raise ValueError(f"model {self.name!r}: the chain has no blocks; add at least one")
        if not 0 <= self.mtp_blocks < self.num_blocks or self.mtp_modules < 0:
            raise ValueError(
                f"model {self.name!r}: mtp_blocks={self.mtp_blocks} (mtp_modules="
                f"{self.mtp_modules}) must be >= 0 and leave at least one decoder block of the "
                f"{self.num_blocks}; build the chain with `mtp.with_mtp`"
            )
        if not 1 <= self.routing_group_top_k <= self.routing_groups:
            raise ValueError(
                f"model {self.name!r}: routing_group_top_k={self.routing_group_top_k} must be "
                f"between 1 and routing_groups={self.routing_groups}; set both to 1 for routing "
                "that is not group-limited"
            )

    @property
    def gated_mlp(self) -> bool:
        """Whether its blocks' MLP is gated (SwiGLU): an eager gated MLP keeps silu(gate)
        (`LayerCost.act_glu_copy_bytes`, filled by the spec for SwiGLU and by the tracer where
        a multiply saves a silu's output; a gate through another activation is not told)."""
        return any(x.act_glu_copy_bytes > 0 for x in self.layers if x.kind == LayerKind.BLOCK)

    @property
    def moe_blocks(self) -> tuple[bool, ...]:
        """Whether each block holds experts, in block order (all False for a dense model)."""
        return tuple(x.expert_params > 0 for x in self.layers if x.kind == LayerKind.BLOCK)

    @property
    def head_size(self) -> int:
        """Width of each attention head (`head_dim`, or hidden / heads)."""
        return self.head_dim or self.hidden // max(1, self.heads)

    @property
    def q_dim(self) -> int:
        """Width of Q and of the attention output (heads x head size)."""
        return self.heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of K and of V (key/value heads x head size)."""
        return self.kv_heads * self.head_size

    @property
    def num_blocks(self) -> int:
        """Number of repeated blocks (the layers a pipeline splits)."""
        return sum(1 for layer in self.layers if layer.kind == LayerKind.BLOCK)

    @property
    def decoder_blocks(self) -> int:
        """Blocks of the decoder itself: `num_blocks` less the multi-token-prediction modules
        trained after them (what a trainer's `num_layers` counts)."""
        return self.num_blocks - self.mtp_blocks

    @property
    def num_params(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        return sum(layer.params + layer.expert_params for layer in self.layers)

    @property
    def is_moe(self) -> bool:
        """Whether the blocks hold MoE experts."""
        return self.experts > 0

    def fingerprint(self) -> str:
        """Stable short digest of everything the planner reads from this profile."""
        fields = asdict(self)
        for name in ("head_dim", "dense_ffn", "shared_expert_ffn", "latent_attention"):
            if not fields[name]:  # profiles from before these keep their fingerprint
                del fields[name]
        for name in ("routing_groups", "routing_group_top_k"):
            if fields[name] == 1:  # likewise (1: not group-limited)
                del fields[name]
        for name in ("mtp_modules", "mtp_blocks"):
            if not fields[name]:  # likewise (0: no multi-token prediction)
                del fields[name]
        for layer in fields["layers"]:  # and traced ones from before the copies were split out
            for name in ("act_norm_copy_bytes", "act_glu_copy_bytes", "attn_window"):
                if not layer[name]:
                    del layer[name]
        payload = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def dense_blocks(profile: ModelProfile) -> tuple[int, ...]:
    """The decoder blocks without experts of a MoE model, counted from 0; empty when every
    block has them and for a dense model (`ModelInfo.dense_blocks`)."""
    moe = profile.moe_blocks[: profile.decoder_blocks]
    if not any(moe):
        return ()
    return tuple(i for i, has in enumerate(moe) if not has)


def attention_windows(profile: ModelProfile) -> tuple[int, ...]:
    """Each decoder block's `LayerCost.attn_window`, in block order; empty when no block has
    one."""
    blocks = [x for x in profile.layers if x.kind == LayerKind.BLOCK][: profile.decoder_blocks]
    windows = tuple(x.attn_window for x in blocks)
    return windows if any(windows) else ()


def windows_text(windows: tuple[int, ...]) -> str:
    """Blocks' sliding windows in words ("sliding windows of 128 keys on 12 of 24 blocks, full
    causal on the rest"); empty when no block has one (`attention_windows`)."""
    sizes = sorted({w for w in windows if w})
    if not sizes:
        return ""
    banded = sum(1 for w in windows if w)
    keys = "/".join(str(w) for w in sizes)
    rest = ", full causal on the rest" if banded < len(windows) else ""
    plural = "s" if banded > 1 else ""
    return f"sliding window{plural} of {keys} keys on {banded} of {len(windows)} blocks{rest}"


def attention_pairs(seq_len: int, window: int = 0) -> int:
    """(query, key) pairs the attention core's FLOPs count for `seq_len` tokens: every pair,
    s^2, with no causal discount (Narayanan et al. 2021 Eq. 3, which counts the full score
    matrix; a causal kernel computes about half: `cost.compute.CAUSAL_FRACTION`). A sliding
    window of w keys counts its band the same way, mirrored to both sides of the diagonal
    (|i - j| < w): s(2w - 1) - w(w - 1) pairs, s^2 at w = s; the causal kernel then computes
    about half of it again, the s w - w(w - 1)/2 pairs the mask keeps. `window` 0 (or >= s):
    the whole sequence."""
    s, w = seq_len, window
    if w <= 0 or w >= s:
        return s * s
    return s * (2 * w - 1) - w * (w - 1)
