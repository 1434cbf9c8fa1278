"""Megatron-LM: a plan as `pretrain_gpt.py` arguments, and argument files read back.

Flag names are Megatron-LM's `megatron/training/arguments.py` (checked at the commit named in
docs/export.md); most are generated there from megatron-core's `TransformerConfig` fields
(``--tensor-model-parallel-size`` is `tensor_model_parallel_size`), the rest are training
arguments (batch, sequence, distributed optimizer, Megatron-FSDP, offload).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import replace

from ..planner.config import Precision, RecomputeModule
from ..planner.cost.count_split import CountSplit
from ..planner.cost.stage_core import ep_overlap_applies
from ..planner.frameworks import Framework
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from .setup import (
    Gap,
    RuntimeSays,
    Target,
    TrainerSetup,
    check_batch,
    option_gaps,
    uniform_recompute,
)

_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP `--data-parallel-sharding-strategy` per ZeRO stage."""
_VALUE_FLAGS = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "num-virtual-stages-per-pipeline-rank",
    "num-layers-per-virtual-pipeline-stage",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "moe-token-dispatcher-type",
    "micro-batch-size",
    "global-batch-size",
    "seq-length",
    "recompute-granularity",
    "recompute-method",
    "recompute-num-layers",
    "data-parallel-sharding-strategy",
    "num-layers",
    "optimizer-offload-fraction",
    "fp8-format",
    "fp8-recipe",
    "pipeline-model-parallel-layout",
    "recompute-modules",
    "cp-comm-type",
    "decoder-first-pipeline-num-layers",
    "decoder-last-pipeline-num-layers",
)
"""Flags with a value that `read` interprets."""
_SWITCHES = (
    "sequence-parallel",
    "bf16",
    "fp16",
    "use-distributed-optimizer",
    "use-megatron-fsdp",
    "optimizer-cpu-offload",
    "tp-comm-overlap",
    "overlap-moe-expert-parallel-comm",
    "delay-wgrad-compute",
    "account-for-embedding-in-pipeline-split",
    "account-for-loss-in-pipeline-split",
    "moe-grouped-gemm",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "grad-reduce-in-bf16",
    "no-bias-swiglu-fusion",
    "fp8-param-gather",
    "no-overlap-p2p-communication",
)
"""Flags without a value that `read` interprets (`--tp-comm-overlap` and
`--overlap-moe-expert-parallel-comm`: the runtime, NeMo's preset where either is on,
Megatron-LM's where neither is)."""
_LIST_FLAGS = ("recompute-modules",)
"""Flags that take a list of words (Megatron-LM's ``nargs="*"``)."""
_CORE = (RecomputeModule.CORE_ATTN,)
"""Megatron-Core's default `recompute_modules`: the attention core."""


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
    embedding, "t" a block, "L" the head and loss, "|" between chunks, in model order: chunk c
    runs on rank c mod pp, as Megatron's interleaving places them), when they are not
    Megatron's default even split of the blocks (else None: nothing to write)."""
    last = len(plan.layers) - 1
    chunks = sorted((c for st in plan.stages for c in st.chunks), key=lambda c: c.chunk)
    parts = [
        "".join(
            "E" if i == 0 else "L" if i == last else "t"
            for i in range(c.first_layer, c.last_layer + 1)
        )
        for c in chunks
    ]
    counts = {p.count("t") for p in parts}
    return None if len(counts) == 1 else "|".join(parts)


def _layout_chunks(layout: str) -> int:
    """Chunks of a `--pipeline-model-parallel-layout` string."""
    return len(_layout_blocks(layout))


def _layout_blocks(layout: str) -> tuple[int, ...]:
    """Blocks ("t") of each chunk of a `--pipeline-model-parallel-layout` string in model
    order, its repetitions unrolled as megatron-core's `PipelineParallelLayerLayout.
    parse_str_to_list` does."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return tuple(part.count("t") for part in text.split("|"))


def _count_split(args: dict[str, str | None], num: Callable[[str, int], int]) -> CountSplit:
    """How Megatron-Core splits the blocks over the pipeline chunks under these arguments:
    the layout's chunks where one is given, else by count (`cost/count_split.py`)."""
    layout = args.get("pipeline-model-parallel-layout")
    if layout:
        return CountSplit(chunk_blocks=_layout_blocks(layout))
    first, last = "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"
    for key in (first, last):
        if key in args and num(key, 0) < 0:
            raise ValueError(f"--{key} {args[key]}: give 0 or more blocks")
    return CountSplit(
        first_stage_blocks=num(first, 0) if first in args else None,
        last_stage_blocks=num(last, 0) if last in args else None,
        embedding_as_layer="account-for-embedding-in-pipeline-split" in args,
        loss_as_layer="account-for-loss-in-pipeline-split" in args,
    )


def render(plan: Plan, s: Strategy) -> str:
    """The `pretrain_gpt.py` arguments of `s` (Megatron-expressible), one per line."""
    m, t = plan.model, plan.train
    args: list[tuple[str, object]] = [
        ("num-layers", m.num_blocks),
        ("hidden-size", m.hidden),
        ("num-attention-heads", m.heads),
    ]
    if m.head_dim:  # heads set apart from hidden / heads (Qwen3): Megatron's kv_channels
        args.append(("kv-channels", m.head_dim))
    if m.kv_heads != m.heads:
        args += [("group-query-attention", None), ("num-query-groups", m.kv_heads)]
    if m.experts:  # the experts' GEMMs grouped, as priced (Megatron's default runs them in turn)
        args += [("num-experts", m.experts), ("moe-grouped-gemm", None)]
    args += [
        ("seq-length", t.seq_len),
        ("max-position-embeddings", t.seq_len),
        ("tensor-model-parallel-size", s.tp),
        ("pipeline-model-parallel-size", s.pp),
        ("context-parallel-size", s.cp),
    ]
    if s.ep > 1:
        # the token dispatch priced: all-to-all (Megatron-LM's default is "allgather")
        args.append(("expert-model-parallel-size", s.ep))
        args.append(("moe-token-dispatcher-type", "alltoall"))
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
    if t.runtime.ep_comm_overlap and ep_overlap_applies(s, nmb, t.precision):
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
    ]
    lines += [f"--{k}" if v is None else f"--{k} {v}" for k, v in args]
    return "\n".join(lines) + "\n"


def parse_args(text: str) -> dict[str, str | None]:
    """An argument file (shell words; ``#`` comments, backslash line ends) as flag -> value
    (None for a switch). Raises ValueError on a stray value or a repeated flag."""
    words = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)  # line continuations
    out: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            i += 1  # a command word (torchrun, pretrain_gpt.py) or another tool's value
            continue
        key, eq, value = word[2:].partition("=")
        key = key.replace("_", "-")
        if key in _LIST_FLAGS and not eq:  # nargs="*": every word up to the next flag
            j = i + 1
            while j < len(words) and not words[j].startswith("--"):
                j += 1
            value, i = " ".join(words[i + 1 : j]), j - 1
        elif not eq and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 1
        if key in out:
            raise ValueError(f"Megatron arguments: --{key} given twice")
        out[key] = value if (eq or value) else None
        i += 1
    return out


def read(text: str, *, world_size: int, source: str) -> TrainerSetup:
    """A Megatron-LM argument file in the planner's terms, on `world_size` GPUs."""
    args = parse_args(text)
    notes: list[str] = []

    def num(key: str, default: int) -> int:
        raw = args.get(key)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{source}: --{key} {raw!r} must be an integer") from None

    for key in _SWITCHES:
        if args.get(key) not in (None, "true", "True"):
            raise ValueError(f"{source}: --{key} takes no value (got {args[key]!r})")
    tp, pp = num("tensor-model-parallel-size", 1), num("pipeline-model-parallel-size", 1)
    cp, ep = num("context-parallel-size", 1), num("expert-model-parallel-size", 1)
    if min(tp, pp, cp, ep) < 1 or world_size % (tp * pp * cp):
        raise ValueError(
            f"{source}: tp {tp} x pp {pp} x cp {cp} does not divide the cluster's {world_size} "
            "GPUs; fix the degrees or give the matching --cluster"
        )
    dp = world_size // (tp * pp * cp)
    vstages = num("num-virtual-stages-per-pipeline-rank", 1)
    if args.get("pipeline-model-parallel-layout"):  # chunks = pp x virtual stages
        vstages = max(1, _layout_chunks(str(args["pipeline-model-parallel-layout"])) // pp)
    if "num-layers-per-virtual-pipeline-stage" in args:
        per = num("num-layers-per-virtual-pipeline-stage", 1)
        vstages = num("num-layers", 0) // (pp * per)
        if vstages < 1:
            raise ValueError(
                f"{source}: --num-layers-per-virtual-pipeline-stage needs --num-layers"
            )
    fsdp = "use-megatron-fsdp" in args
    strategy_name = args.get("data-parallel-sharding-strategy") or "optim_grads_params"
    zero = 0
    if fsdp:
        found = [z for z, n in _FSDP_STRATEGY.items() if n == strategy_name]
        zero = found[0] if found else 1 if strategy_name == "optim" else 0
    elif "use-distributed-optimizer" in args:
        zero = 1
    recompute, modules = Recompute.NONE, _CORE
    granularity = args.get("recompute-granularity")
    if granularity == "selective":
        recompute = Recompute.SELECTIVE
        given = "recompute-modules" in args  # given empty (nargs="*"): nothing recomputed
        named = str(args.get("recompute-modules") or "").split() if given else ["core_attn"]
        unpriced = [m for m in named if m not in set(RecomputeModule)]
        if unpriced:
            notes.append(
                f"--recompute-modules {' '.join(unpriced)} not priced (paraplan prices "
                f"{', '.join(RecomputeModule)}): their memory is counted as kept"
            )
        modules = tuple(RecomputeModule(m) for m in named if m not in unpriced)
        if RecomputeModule.MOE_ACT in modules and "moe-grouped-gemm" not in args:
            raise ValueError(
                f"{source}: --recompute-modules moe_act needs --moe-grouped-gemm (Megatron-Core "
                "refuses it otherwise); add --moe-grouped-gemm or leave moe_act out"
            )
    elif granularity == "full":
        method, layers = args.get("recompute-method"), num("recompute-num-layers", 1)
        per_chunk = num("num-layers", 0) // (pp * vstages)
        recompute = Recompute.FULL
        if method == "block" and layers < per_chunk:
            recompute = Recompute.PER_LAYER
            notes.append(
                f"recompute of the first {layers} layers of each stage evaluated as per_layer "
                "(the recompute solver's least recomputation that fits)"
            )
    elif granularity is not None:
        raise ValueError(
            f"{source}: --recompute-granularity {granularity!r}: use full or selective"
        )
    precision = (
        Precision.BF16 if "bf16" in args else Precision.FP16 if "fp16" in args else Precision.FP32
    )
    if args.get("fp8-format") and precision == Precision.BF16:
        precision = Precision.FP8
    if "fp8-param-gather" in args and not args.get("fp8-format"):  # as Megatron-Core refuses it
        raise ValueError(f"{source}: --fp8-param-gather needs fp8 training; add --fp8-format")
    mbs = num("micro-batch-size", 1)
    etp = num("expert-tensor-parallel-size", tp)  # Megatron's default: tp
    if etp not in (1, tp):
        raise ValueError(
            f"{source}: --expert-tensor-parallel-size {etp} has no paraplan model: use 1 "
            f"(experts whole, folded over TP) or the TP size {tp}"
        )
    strategy = Strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        expert_tp=1 if etp == 1 and tp > 1 else None,
        zero_stage=zero,
        offload_optimizer="optimizer-cpu-offload" in args and zero > 0,
        sequence_parallel="sequence-parallel" in args and tp > 1,
        schedule=(
            Schedule.NONE
            if pp == 1
            else Schedule.INTERLEAVED_1F1B
            if vstages > 1
            else Schedule.ONE_F_ONE_B
        ),
        virtual_stages=vstages if pp > 1 else 1,
        micro_batch_size=mbs,
        recompute=recompute,
    )
    if "seq-length" not in args:
        raise ValueError(f"{source}: --seq-length is missing; Megatron needs it")
    dispatcher = args.get("moe-token-dispatcher-type") or "allgather"  # Megatron-LM's default
    if ep > 1 and dispatcher not in ("alltoall", "flex"):
        notes.append(
            f"the {dispatcher} token dispatcher is priced as all-to-all dispatch (paraplan "
            "prices expert parallelism's tokens by all-to-all)"
        )
    cp_comm = args.get("cp-comm-type") or "p2p"  # Megatron-Core's default: the ring
    if cp > 1 and cp_comm != "p2p":
        notes.append(
            f"--cp-comm-type {cp_comm} priced as p2p (paraplan prices context parallelism as "
            "ring attention, K/V passed around the ring under the attention compute)"
        )
    split = _count_split(args, num) if pp > 1 else None
    if split is not None:  # what the pipeline stages hold, as Megatron-Core builds them
        notes.append(f"blocks over the pipeline chunks: {split.describe()}")
    # data-parallel overlap, where there is data-parallel traffic (Megatron-LM's default: off)
    grads_overlap = "overlap-grad-reduce" in args or dp * cp == 1
    params_overlap = "overlap-param-gather" in args or dp * cp == 1 or zero == 0
    for flag, on in (
        ("overlap-grad-reduce", grads_overlap),
        ("overlap-param-gather", params_overlap),
    ):
        if not on:
            notes.append(f"without --{flag} its data-parallel traffic is priced exposed")
    ep_overlap = "overlap-moe-expert-parallel-comm" in args
    overlaps = "tp-comm-overlap" in args or ep_overlap
    if ep > 1 and overlaps and ("tp-comm-overlap" in args) != ep_overlap and tp > 1:
        notes.append(
            "one of --tp-comm-overlap and --overlap-moe-expert-parallel-comm is priced as "
            "NeMo's runtime, which overlaps both"
        )
    setup = TrainerSetup(
        target=Target.MEGATRON,
        strategy=strategy,
        global_batch=num("global-batch-size", mbs * dp),
        seq_len=num("seq-length", 0),
        precision=precision,
        notes=tuple(notes),
        runtime=Framework.NEMO if overlaps else Framework.MEGATRON,
        split=split,
        runtime_says=RuntimeSays(
            recompute_modules=modules if recompute == Recompute.SELECTIVE else _CORE,
            grad_reduce_overlap=grads_overlap,
            param_gather_overlap=params_overlap,
            fp32_grads="grad-reduce-in-bf16" not in args,
            glu_keeps_input_only="no-bias-swiglu-fusion" not in args,
            pp_comm_overlap="no-overlap-p2p-communication" not in args,
            fp8_all_gather=("fp8-param-gather" in args) if precision == Precision.FP8 else None,
        ),
    )
    return check_batch(setup)
