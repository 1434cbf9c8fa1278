"""Megatron-LM: a plan as `pretrain_gpt.py` arguments (argument files are read back in
`megatron_read.py`).

Flag names are Megatron-LM's `megatron/training/arguments.py` (checked at the commit named in
docs/export.md); most are generated there from megatron-core's `TransformerConfig` fields
(``--tensor-model-parallel-size`` is `tensor_model_parallel_size`), the rest are training
arguments (batch, sequence, distributed optimizer, Megatron-FSDP, offload).
"""

from __future__ import annotations

from dataclasses import replace

from ..planner.config import EpDispatch, Precision
from ..planner.cost.stage_core import ep_overlap_applies
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from .megatron_moe import architecture_args
from .megatron_read import _CORE, _FSDP_STRATEGY, parse_args, read
from .megatron_windows import window_args
from .setup import Gap, Target, option_gaps, uniform_recompute

__all__ = [
    "block_pattern",
    "nearest",
    "parse_args",
    "pipeline_layout",
    "read",
    "render",
    "window_args",
]


def block_pattern(plan: Plan) -> int | None:
    """k when every pipeline chunk fully recomputes its first k blocks and nothing else
    (Megatron's ``--recompute-method block --recompute-num-layers k``); None otherwise."""
    chunks = [c for st in plan.stages for c in st.chunks]
    counts = set()
    for c in chunks:
        policies = [
            d.recompute
            for d in plan.layers[c.first_layer : c.last_layer + 1]
            if d.name.startswith("block")
        ]
        k = sum(p == Recompute.FULL for p in policies)
        if policies != [Recompute.FULL] * k + [Recompute.NONE] * (len(policies) - k):
            return None
        counts.add(k)
    return counts.pop() if len(counts) == 1 else None


def nearest(plan: Plan, s: Strategy) -> tuple[Strategy, list[Gap]]:
    """The strategy Megatron-LM can run that is nearest to `s`, and what differs."""
    gaps: list[Gap] = []
    sizes = sorted({w for w in plan.model.attention_windows if w})
    if len(sizes) > 1:  # megatron-core has one window_size for every windowed block
        gaps.append(
            Gap(feature=f"sliding windows of {len(sizes)} sizes ({sizes} keys)", nearest="")
        )
    if s.schedule == Schedule.GPIPE:
        gaps.append(Gap(feature="GPipe schedule", nearest="1F1B (Megatron has no GPipe)"))
        s = replace(s, schedule=Schedule.ONE_F_ONE_B)
    if s.schedule in (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV):
        # no split backward in Megatron-LM: its interleaved 1F1B with the same chunks per rank
        # (looped, not a V), or plain 1F1B for one chunk
        looped = Schedule.INTERLEAVED_1F1B if s.virtual_stages > 1 else Schedule.ONE_F_ONE_B
        gaps.append(
            Gap(
                feature=f"{s.schedule} schedule (zero-bubble: backward split into B and W)",
                nearest=f"{looped}"
                + (f" with {s.virtual_stages} chunks per rank" if s.virtual_stages > 1 else "")
                + " (Megatron-LM has no zero-bubble schedule)",
            )
        )
        s = replace(s, schedule=looped)
    s, gaps_opt = option_gaps(
        s,
        Target.MEGATRON,
        why={
            "offload_activations": "activations kept on the GPU (Megatron's --cpu-offloading "
            "refuses pipeline parallelism and recomputation, and keeps the last layer's)",
        },
    )
    gaps += gaps_opt
    if s.dp_shard is not None and s.dp_shard < s.dp:
        gaps.append(
            Gap(
                feature=f"HSDP (shard groups of {s.dp_shard} of dp={s.dp})",
                nearest="Megatron-FSDP sharding over the whole data-parallel group",
            )
        )
        s = replace(s, dp_shard=None)
    if s.recompute == Recompute.PER_LAYER and block_pattern(plan) is None:
        policy = uniform_recompute(plan)
        gaps.append(
            Gap(
                feature="per-layer recompute (not the first k blocks of every stage)",
                nearest=f"{policy} for every block",
            )
        )
        s = replace(s, recompute=policy)
    if s.mesh_order != DEFAULT_MESH_ORDER:
        gaps.append(
            Gap(
                feature=f"mesh order {','.join(s.mesh_order)}",
                nearest="Megatron's order tp-cp-dp-pp (innermost first)",
            )
        )
        s = replace(s, mesh_order=DEFAULT_MESH_ORDER)
    return s, gaps  # any split of the layers: `pipeline_layout`


def pipeline_layout(plan: Plan) -> str | None:
    """The plan's pipeline chunks as Megatron-Core's `--pipeline-model-parallel-layout` ("E" the
    embedding, "t" a block, "m" a multi-token-prediction module, "L" the head and loss, "|"
    between chunks, in model order: chunk c runs on rank c mod pp, as Megatron's interleaving
    places them), when they are not Megatron's default even split of the blocks (which puts
    the modules on the last stage too; else None: nothing to write)."""
    last = len(plan.layers) - 1
    first_mtp = last - plan.train.mtp_layers
    chunks = sorted((c for st in plan.stages for c in st.chunks), key=lambda c: c.chunk)
    parts = [
        "".join(
            "E" if i == 0 else "L" if i == last else "m" if i >= first_mtp else "t"
            for i in range(c.first_layer, c.last_layer + 1)
        )
        for c in chunks
    ]
    counts = {p.count("t") for p in parts}
    return None if len(counts) == 1 else "|".join(parts)


def render(plan: Plan, s: Strategy) -> str:
    """The `pretrain_gpt.py` arguments of `s` (Megatron-expressible), one per line."""
    m, t = plan.model, plan.train
    args: list[tuple[str, object]] = [
        ("num-layers", m.num_blocks),
        ("hidden-size", m.hidden),
        ("num-attention-heads", m.heads),
    ]
    if m.head_dim and m.latent_attention is None:  # heads set apart from hidden / heads
        args.append(("kv-channels", m.head_dim))  # (Qwen3): Megatron's kv_channels
    if m.kv_heads != m.heads:
        args += [("group-query-attention", None), ("num-query-groups", m.kv_heads)]
    args += window_args(m)
    if m.ffn:  # the MLP as planned (Megatron's default: 4 x hidden, GELU, tied embeddings)
        # the dense blocks' where a MoE model sets them apart (the experts' then follows as
        # --moe-ffn-hidden-size), else each expert's too
        args.append(("ffn-hidden-size", m.dense_ffn or m.ffn))
        if m.gated_mlp:
            args.append(("swiglu", None))
        if not m.tied_embeddings:
            args.append(("untie-embeddings-and-output-weights", None))
    if m.experts:  # the experts' GEMMs grouped, as priced (Megatron's default runs them in turn)
        args += [("num-experts", m.experts), ("moe-grouped-gemm", None)]
        if m.top_k:  # Megatron-Core's default routes each token to 2
            args.append(("moe-router-topk", m.top_k))
    args += architecture_args(m)  # latent attention, dense blocks, shared experts
    if t.mtp_layers:  # trained after the blocks, as priced (Megatron's default: none)
        args.append(("mtp-num-layers", t.mtp_layers))
    args += [
        ("seq-length", t.seq_len),
        ("max-position-embeddings", t.seq_len),
        ("tensor-model-parallel-size", s.tp),
        ("pipeline-model-parallel-size", s.pp),
        ("context-parallel-size", s.cp),
    ]
    if s.ep > 1:
        # the token dispatch priced (Megatron-LM's default is "allgather"): one all-to-all, or
        # once per node through the flex dispatcher's DeepEP (`EpDispatch.HIERARCHICAL`)
        args.append(("expert-model-parallel-size", s.ep))
        if t.runtime.ep_dispatch == EpDispatch.HIERARCHICAL:
            args.append(("moe-token-dispatcher-type", "flex"))
            args.append(("moe-flex-dispatcher-backend", "deepep"))
        else:
            args.append(("moe-token-dispatcher-type", "alltoall"))
    if m.experts and m.routing_groups > 1:  # group-limited routing, as priced
        args.append(("moe-router-num-groups", m.routing_groups))
        args.append(("moe-router-group-topk", m.routing_group_top_k))
    if s.folded_experts:  # Megatron's default is tp: experts split as the dense layers
        args.append(("expert-tensor-parallel-size", 1))
    if s.virtual_stages > 1:
        args.append(("num-virtual-stages-per-pipeline-rank", s.virtual_stages))
    layout = pipeline_layout(plan) if s.pp > 1 else None
    if layout is not None:
        args.append(("pipeline-model-parallel-layout", layout))
    if s.sequence_parallel:
        args.append(("sequence-parallel", None))
        if t.runtime.tp_comm_overlap and s.tp > 1:  # priced with it (`--runtime nemo`)
            args.append(("tp-comm-overlap", None))
    nmb = t.global_batch // (s.dp * s.micro_batch_size)
    if t.runtime.ep_comm_overlap and ep_overlap_applies(s, nmb, t.precision, t.mtp_layers):
        # priced with the experts' all-to-alls under another micro-batch (`--runtime nemo`)
        args += [("overlap-moe-expert-parallel-comm", None), ("delay-wgrad-compute", None)]
    args += [("micro-batch-size", s.micro_batch_size), ("global-batch-size", t.global_batch)]
    if t.precision == Precision.FP8:  # bf16, the blocks' linear layers in Transformer
        # Engine's fp8 with tensorwise current scaling (paraplan's fp8: cost/float8.py)
        args += [("bf16", None), ("fp8-format", "hybrid"), ("fp8-recipe", "tensorwise")]
        if plan.train.runtime.fp8_all_gather:  # as priced (Megatron-LM's default: bf16)
            args.append(("fp8-param-gather", None))
    elif t.precision != Precision.FP32:
        args.append((str(t.precision), None))
    if s.zero_stage == 1:
        args.append(("use-distributed-optimizer", None))
    elif s.zero_stage >= 2:
        args += [
            ("use-megatron-fsdp", None),
            ("use-distributed-optimizer", None),
            ("data-parallel-sharding-strategy", _FSDP_STRATEGY[s.zero_stage]),
        ]
    runtime = plan.train.runtime
    if s.dp * s.cp > 1 and runtime.grad_reduce_overlap:  # as priced (Megatron's default: off)
        args.append(("overlap-grad-reduce", None))
        if s.zero_stage >= 1 and runtime.param_gather_overlap:
            args.append(("overlap-param-gather", None))
    if not runtime.fp32_grads and t.precision != Precision.FP32:  # as priced (Megatron-LM's
        args.append(("grad-reduce-in-bf16", None))  # default under --bf16: fp32)
    if s.offload_optimizer:
        args += [("optimizer-cpu-offload", None), ("optimizer-offload-fraction", 1.0)]
    if s.recompute == Recompute.SELECTIVE:
        args.append(("recompute-granularity", "selective"))
        modules = runtime.recompute_modules
        if modules != _CORE:  # else Megatron-Core's default
            args.append(("recompute-modules", " ".join(modules)))
    elif s.recompute == Recompute.FULL:
        args += [
            ("recompute-granularity", "full"),
            ("recompute-method", "uniform"),
            ("recompute-num-layers", 1),
        ]
    elif s.recompute == Recompute.PER_LAYER:
        k = block_pattern(plan)
        if k:  # 0: nothing recomputed
            args += [
                ("recompute-granularity", "full"),
                ("recompute-method", "block"),
                ("recompute-num-layers", k),
            ]
    lines = [
        f"# Megatron-LM pretrain_gpt.py arguments written by {plan.generator} for {m.name} on "
        f"{plan.cluster.name} ({plan.cluster.num_gpus} GPUs): {plan.short()}",
        "# use: torchrun ... pretrain_gpt.py $(grep -v '^#' THIS_FILE) <data, tokenizer, lr...>",
        "# the model's sizes, MLP and routing are written; add its normalization, positions and "
        "biases (a Llama: --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear)",
    ]
    lines += [f"--{k}" if v is None else f"--{k} {v}" for k, v in args]
    return "\n".join(lines) + "\n"
