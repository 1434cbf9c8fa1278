"""The training configuration: batch, sequence, precision, optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

FP32_BYTES = 4


class Precision(StrEnum):
    """Training precision. `bf16`/`fp16` are mixed precision with fp32 master weights; `fp8`
    is bf16 mixed precision whose blocks' linear layers run their GEMMs in fp8 with dynamic
    scaling (torchao's Float8Linear as torchtitan applies it, Transformer Engine's recipes in
    NeMo and Megatron-LM): priced in `cost/float8.py`."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Optimizer(StrEnum):
    """Optimizer, which sets the bytes of state per parameter."""

    ADAMW = "adamw"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    ADAM8BIT = "adam8bit"


# Optimizer state bytes per parameter, without master weights.
OPTIMIZER_STATE_BYTES: dict[Optimizer, int] = {
    # fp32 momentum + variance (Rajbhandari et al. 2019 §3.1: K=12 with the master weights)
    Optimizer.ADAMW: 8,
    Optimizer.SGD: 4,  # fp32 momentum buffer
    # Factored second moment: O(rows + cols) per matrix, no momentum (Shazeer & Stern 2018 §3);
    # negligible per parameter for the matrices that dominate a transformer.
    Optimizer.ADAFACTOR: 0,
    Optimizer.ADAM8BIT: 2,  # two 8-bit states (Dettmers et al. 2022 §2), block scales ignored
}


class AttentionKernel(StrEnum):
    """Which fused attention kernel the training framework runs."""

    SDPA = "sdpa"
    """torch's scaled_dot_product_attention, flash backend (FlashAttention-2; Dao 2023)."""
    FUSED = "fused"
    """Transformer Engine / cuDNN fused attention (Hopper-native on H100, as Megatron runs)."""


class SelectiveRecompute(StrEnum):
    """What a framework's "selective" activation recomputation recomputes."""

    ATTENTION_CORE = "attention_core"
    """The attention core only: scores, softmax, dropout, attention over V (Korthikanti et al.
    2022 §5; Megatron-LM's `--recompute-granularity selective`, and paraplan's executor)."""
    EVERY_OTHER_MATMUL = "every_other_matmul"
    """torchtitan's per-operator selective checkpointing (`selective_ac_option = "op"`,
    torchtitan/distributed/activation_checkpoint.py): within each block every second matmul
    and every elementwise operator is recomputed; the other matmuls' outputs and the fused
    attention's are saved."""


class RecomputeModule(StrEnum):
    """A module of a block Megatron-Core's selective recompute may recompute (its
    `recompute_modules` names; `Runtime.recompute_modules`)."""

    CORE_ATTN = "core_attn"
    """The attention core (Korthikanti et al. 2022 §5): Megatron-Core's default."""
    LAYERNORM = "layernorm"
    """The two norms' outputs (the attention's and the MLP's inputs), discarded once consumed
    and recomputed from the kept norm inputs (`CheckpointWithoutOutput`)."""
    MOE_ACT = "moe_act"
    """The routed experts' activation output (the down projection's input), recomputed from
    the kept up projection output."""
    MLA_UP_PROJ = "mla_up_proj"
    """Multi-head latent attention's up projections and rotary embedding: the query, key and
    value the attention core keeps, discarded and recomputed from the kept compressed latents
    (`CheckpointWithoutOutput`; Megatron-Core refuses it without latent attention)."""
    MLP = "mlp"
    """The dense MLP of each block without experts (norm, up and gate projections, activation,
    down projection), recomputed from its kept input (plain checkpointing)."""
    MOE = "moe"
    """The whole MoE layer of each block with experts (router, token dispatch, routed and
    shared experts, combine), checkpointed from its kept input (`MoELayer.moe_layer_recompute`):
    its two all-to-alls run again in the recompute."""
    SHARED_EXPERTS = "shared_experts"
    """The shared experts' MLP of each block with experts, checkpointed from its kept input
    (`MoELayer.shared_experts_recompute`; Megatron-Core refuses it with
    `--moe-shared-expert-overlap`)."""


class Float8Casts(StrEnum):
    """How a framework makes the fp8 operands of its linear layers under fp8 training
    (`Precision.FP8`; priced in `cost/float8.py`)."""

    TORCHAO = "torchao"
    """torchao's `Float8Linear` (torchtitan): every micro-batch casts the input and the weight in
    forward; backward casts the output gradient, lays it out a second time, and casts the saved
    bf16 input and weight again."""
    TRANSFORMER_ENGINE = "transformer_engine"
    """Transformer Engine's Linear under Megatron-Core (NeMo, Megatron-LM): forward casts the input
    to fp8 in both layouts at once and saves that for backward, backward casts the output gradient
    in both layouts at once; the weight is cast once per step, on the first micro-batch, and its
    fp8 copies are reused by the others (`is_first_microbatch`, which Megatron-Core's schedules
    set through `set_is_first_microbatch`)."""


class EpDispatch(StrEnum):
    """How a MoE layer's tokens travel to their experts' ranks and back (`Runtime.ep_dispatch`;
    priced in `cost/routing.py` and `Collectives.dispatch`)."""

    ALL_TO_ALL = "alltoall"
    """One pairwise all-to-all of every (token, expert) copy (Megatron-Core's `alltoall`
    dispatcher, torchtitan's default, paraplan's executor): a token whose k experts sit on other
    nodes crosses the network k times."""
    HIERARCHICAL = "hierarchical"
    """Node-deduplicated: a token crosses once to each other node holding any of its experts,
    over RDMA to the GPU of its own local index there, which forwards it over NVLink to the
    experts' GPUs, the two pipelined; combine runs the reverse (DeepEP's normal kernels,
    DeepSeek-V3 arXiv 2412.19437 §3.2.2 and github.com/deepseek-ai/DeepEP; HybridEP; Megatron-
    Core's `--moe-token-dispatcher-type flex` with `--moe-flex-dispatcher-backend deepep` or
    `hybridep`; torchtitan's `deepep` and `hybridep` communication backends)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    """How the training framework runs a step's kernels. The defaults are paraplan's own
    executor (eager PyTorch); published runs of other frameworks set theirs."""

    fused_elementwise: bool = False
    """Norms, activations, rotary embeddings and residual adds run as fused kernels (Megatron's
    and Transformer Engine's fused kernels, or torch.compile); False: eager PyTorch, one kernel
    per operator, each streaming its inputs and output through memory."""
    tp_comm_overlap: bool = False
    """TP collectives overlap the GEMMs they feed (Megatron's --tp-comm-overlap with Transformer
    Engine userbuffers, or torch's async TP); False: they sit on the critical path."""
    ep_comm_overlap: bool = False
    """The experts' all-to-alls overlap another micro-batch's compute: Megatron-Core's
    `--overlap-moe-expert-parallel-comm` (with `--delay-wgrad-compute`; Megatron-Bridge's
    `overlap_moe_expert_parallel_comm`) runs one micro-batch's forward merged with another's
    backward, each one's dispatch and combine on a communication stream under the other's
    compute (the computation-communication overlap of DeepSeek-V3, arXiv 2412.19437 §3.2.1,
    across micro-batches). Needs two micro-batches or more; False: on the critical path."""
    ep_dispatch: EpDispatch = EpDispatch.ALL_TO_ALL
    """How the experts' tokens are dispatched and combined across the expert-parallel group."""
    grad_reduce_overlap: bool = True
    """Data-parallel gradient reductions overlap the backward that produces them (torch DDP's
    buckets, FSDP2's, Megatron-LM's `--overlap-grad-reduce`, on in every Megatron-Bridge
    recipe); False: reduced after the backward, exposed (Megatron-LM's default without the
    flag)."""
    param_gather_overlap: bool = True
    """ZeRO-1/2's gather of the updated parameters overlaps the next forward (Megatron-LM's
    `--overlap-param-gather`); False: gathered after the optimizer step, exposed."""
    pp_comm_overlap: bool = False
    """Under interleaved 1F1B, each pipeline send and receive runs asynchronously under the
    next chunk's compute: Megatron-Core's `overlap_p2p_comm` (on by default for interleaved
    schedules in Megatron-LM, `--no-overlap-p2p-communication` turns it off, and set by
    Megatron-Bridge wherever virtual stages are used, `training/comm_overlap.py`). False:
    each waits on the critical path (Megatron's other schedules batch each send with its
    receive; paraplan's executor and torch's schedules)."""
    attention: AttentionKernel = AttentionKernel.SDPA
    """Fused attention kernel."""
    selective: SelectiveRecompute = SelectiveRecompute.ATTENTION_CORE
    """What `Recompute.SELECTIVE` recomputes in this framework."""
    recompute_modules: tuple[RecomputeModule, ...] = (RecomputeModule.CORE_ATTN,)
    """Under `SelectiveRecompute.ATTENTION_CORE`, the modules `Recompute.SELECTIVE` recomputes
    in each block: Megatron-Core's `--recompute-modules` (its default, and paraplan's executor:
    the attention core alone; NeMo's MoE recipes name others, `cost/selective.py`)."""
    sp_saves_gathered_input: bool = True
    """Under sequence parallelism, the column-parallel Linears keep their all-gathered input
    whole for backward (torch's SequenceParallel with ColwiseParallel, as paraplan's executor and
    torchtitan run it: measured on the executor's GPT-2 block on 2 gloo ranks, SP saved only
    the norms' inputs' share over plain TP, 2026-11-25). False: Megatron-LM keeps the sequence
    shard and all-gathers it again in backward (Korthikanti et al. 2022 §4.2.2)."""
    norm_keeps_input_only: bool = False
    """The norms keep only their input and per-token statistics for backward: Transformer
    Engine's LayerNormLinear, which Megatron-Core fuses into the QKV and first MLP linears (it
    saves the norm's input, mu, rsigma and the normalized output the linear needs, no other
    copy: transformer_engine/pytorch/module/layernorm_linear.py), and its fused RMSNorm before
    the head. False: an RMSNorm as eager torch and Hugging Face write it also keeps the
    normalized hidden state for the weight multiply (`LayerCost.act_norm_copy_bytes`)."""
    glu_keeps_input_only: bool = False
    """A gated MLP's activation keeps only its input, the up projection's gate and up halves,
    and recomputes silu(gate) in backward: Megatron-Core's fused SwiGLU (`bias_swiglu_impl`,
    whose `SwiGLUFunction` saves its input alone; on under `bias_activation_fusion`, Megatron-
    LM's default `--bias-swiglu-fusion` and Megatron-Bridge's Llama, Qwen, DeepSeek and gpt-oss
    providers). False: eager torch's multiply keeps silu(gate) too (`act_glu_copy_bytes`)."""
    torch_loss: bool = True
    """The loss is torch's cross-entropy on fp32 logits, under TP torch's vocabulary-parallel
    `loss_parallel` (paraplan's executor, torchtitan): its backward holds 2 more logits-sized
    fp32 buffers at its peak, 3 under `loss_parallel` (cost/memory.py, measured). False:
    Megatron-LM's fused vocabulary-parallel cross-entropy, which works in place on the logits
    (megatron/core/tensor_parallel/cross_entropy.py) and holds no more than them."""
    fsdp_shared_root: bool = True
    """Under FSDP the embedding and the head share one unit, the root (paraplan's executor:
    tied weights must share a unit), beside one unit per block; False: each its own unit, as
    torchtitan wraps them (`fully_shard` on tok_embeddings, each block, and norm + output)."""
    fp32_grads: bool = True
    """Gradients are accumulated and reduced in fp32 whatever the compute precision: Megatron-LM
    turns `--accumulate-allreduce-grads-in-fp32` on for bf16 (its distributed-optimizer guide:
    "bf16 parameters, fp32 gradients", 18 bytes per parameter, 6 + 12/d sharded), DeepSpeed's
    bf16 optimizer accumulates in fp32, FSDP2 reduces in `reduce_dtype=float32` (torchtitan's
    default) and autocast over fp32 parameters (paraplan's executor beside DDP) leaves fp32
    gradients. False: gradients in the working precision, the ZeRO paper's fp16 accounting
    (Rajbhandari et al. 2020 §3.1: 2 + 2 + 12 bytes per parameter)."""
    fp8_all_gather: bool = False
    """Under fp8 training, ZeRO's parameter all-gathers carry the blocks' linear weights in fp8,
    one byte each: FSDP's, cast on the shard before the all-gather (torchtitan's
    `float8.enable_fsdp_float8_all_gather`, off by default, with
    `precompute_float8_dynamic_scale_for_fsdp`), and Megatron's distributed optimizer's and
    FSDP's with fp8 parameters (`--fp8-param-gather`, off in Megatron-LM by default, on in
    every Megatron-Bridge fp8 recipe: `fp8_param_gather = True` in its mixed-precision
    presets); False: in bf16."""
    fp8_casts: Float8Casts = Float8Casts.TORCHAO
    """How the fp8 operands are made under fp8 training (`Float8Casts`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """What is being trained: batch, sequence length, precision, optimizer."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int
    """Tokens per sequence."""
    precision: Precision = Precision.BF16
    """Compute/parameter precision (mixed precision keeps fp32 master weights)."""
    optimizer: Optimizer = Optimizer.ADAMW
    """Optimizer (sets the optimizer-state bytes per parameter)."""
    memory_headroom: float = 0.1
    """Fraction of device memory kept free for allocator fragmentation and spikes."""
    runtime: Runtime = Runtime()
    """How the framework runs the kernels (paraplan's executor by default)."""
    mtp_layers: int = 0
    """Multi-token-prediction modules trained after the decoder's blocks (`planner/mtp.py`;
    Megatron's `--mtp-num-layers`); 0: none."""

    def __post_init__(self) -> None:
        for name in ("global_batch", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        m = self.mtp_layers
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"mtp_layers={m!r} must be a whole number >= 0")
        for name, enum in (("precision", Precision), ("optimizer", Optimizer)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(str(value).lower()))
            except ValueError:
                allowed = ", ".join(e.value for e in enum)
                raise ValueError(f"{name}={value!r} is not one of {allowed}") from None
        if not 0.0 <= self.memory_headroom < 1.0:
            raise ValueError(
                f"memory_headroom={self.memory_headroom!r} must be a fraction in [0, 1)"
            )

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch * self.seq_len

    @property
    def compute_dtype(self) -> str:
        """Dtype key of the accelerator's peak FLOP/s table for everything but fp8's GEMMs
        (attention, the head, memory-bound kernels): bf16 under fp8. MFU is quoted against
        this peak, so an fp8 plan and a bf16 plan read on one scale (a convention: torchtitan
        quotes no MFU for its fp8 runs, NVIDIA's tables give model TFLOP/s)."""
        return "bf16" if self.precision == Precision.FP8 else str(self.precision)

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter of the working copy (16-bit in mixed precision)."""
        return FP32_BYTES if self.precision == Precision.FP32 else 2

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element, as stored and reduced: fp32 main gradients where the
        runtime keeps them (`Runtime.fp32_grads`, every framework paraplan models in mixed
        precision), else the working dtype's."""
        return FP32_BYTES if self.runtime.fp32_grads else self.param_bytes

    @property
    def optimizer_bytes(self) -> int:
        """Bytes of optimizer state per parameter, fp32 master weights included when mixed."""
        master = 0 if self.precision == Precision.FP32 else FP32_BYTES
        return OPTIMIZER_STATE_BYTES[self.optimizer] + master

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element."""
        return self.param_bytes
