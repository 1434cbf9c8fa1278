"""Megatron-LM argument files read back in the planner's terms (`read`): the flags of
Megatron-LM's `megatron/training/arguments.py` (checked at the commit named in docs/export.md)
that change a step's time or memory, each priced, refused as Megatron-Core refuses it, or
named in the notes when paraplan does not price it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..planner.config import EpDispatch, Precision, RecomputeModule
from ..planner.cost.count_split import CountSplit
from ..planner.cost.recompute_pattern import PatternRule, RecomputePattern
from ..planner.frameworks import Framework
from ..planner.strategy import Recompute, Schedule, Strategy
from .megatron_moe import architecture_said
from .megatron_windows import windows_said
from .setup import ModelSays, RuntimeSays, Stated, Target, TrainerSetup, check_batch
from .shell_words import script_words

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
    "hidden-size",
    "num-attention-heads",
    "num-query-groups",
    "ffn-hidden-size",
    "moe-ffn-hidden-size",
    "num-experts",
    "moe-router-topk",
    "cpu-offloading-num-layers",
    "attention-backend",
    "transformer-impl",
    "window-size",
    "window-attn-skip-freq",
    "moe-layer-freq",
    "moe-shared-expert-intermediate-size",
    "q-lora-rank",
    "kv-lora-rank",
    "qk-head-dim",
    "qk-pos-emb-head-dim",
    "v-head-dim",
    "mtp-num-layers",
    "moe-router-num-groups",
    "moe-router-group-topk",
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
    "recompute-activations",
    "group-query-attention",
    "fine-grained-activation-offloading",
    "swiglu",
    "untie-embeddings-and-output-weights",
    "checkpoint-activations",
    "multi-latent-attention",
)
"""Flags without a value that `read` interprets (`--tp-comm-overlap` and
`--overlap-moe-expert-parallel-comm`: the runtime, NeMo's preset where either is on,
Megatron-LM's where neither is)."""
_CHOICES = {
    "recompute-granularity": ("full", "selective"),
    "recompute-method": ("uniform", "block"),
    "data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "fp8-format": ("e4m3", "hybrid"),
    "fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
    "moe-token-dispatcher-type": ("allgather", "alltoall", "flex"),
}
"""The values Megatron-LM takes for the flags `read` interprets by value (its argparse
`choices` and `TransformerConfig`'s literals, at the commit named in docs/export.md): a
misspelt one would be read as a default."""
_MAY_BE_ZERO = frozenset(
    {
        "decoder-first-pipeline-num-layers",
        "decoder-last-pipeline-num-layers",
        "cpu-offloading-num-layers",
        "recompute-num-layers",
    }
)
"""Counts Megatron takes as 0 (no layers); every other number `read` takes is at least 1."""
_LIST_FLAGS = ("recompute-modules",)
_READ = frozenset((*_VALUE_FLAGS, *_SWITCHES))
"""Every flag `read` interprets."""
"""Flags that take a list of words (Megatron-LM's ``nargs="*"``)."""
_CORE = (RecomputeModule.CORE_ATTN,)
"""Megatron-Core's default `recompute_modules`: the attention core."""


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
    return CountSplit(  # `num` refuses a count below 0 here
        first_stage_blocks=num(first, 0) if first in args else None,
        last_stage_blocks=num(last, 0) if last in args else None,
        embedding_as_layer="account-for-embedding-in-pipeline-split" in args,
        loss_as_layer="account-for-loss-in-pipeline-split" in args,
    )


def _default_ffn(args: dict[str, str | None], num: Callable[[str, int], int]) -> Stated | None:
    """The MLP size Megatron-LM builds without `--ffn-hidden-size` (its `validate_args`: 4 x
    hidden, or under `--swiglu` 4 x hidden x 2/3 rounded down to a multiple of 64), where the
    arguments state the model (`--num-layers`, `--hidden-size`)."""
    if "num-layers" not in args or "hidden-size" not in args:
        return None
    hidden = num("hidden-size", 0)
    size = int(4 * hidden * 2 / 3 / 64) * 64 if "swiglu" in args else 4 * hidden
    return Stated(size, "no --ffn-hidden-size")


def _model_says(
    args: dict[str, str | None], num: Callable[[str, int], int], source: str
) -> ModelSays:
    """The model sizes the arguments state (Megatron-LM takes `--num-query-groups` only under
    `--group-query-attention`: `argument_utils.core_transformer_config_from_args`)."""

    def stated(key: str) -> Stated | None:
        return Stated(num(key, 0), f"--{key}") if key in args else None

    gqa = "group-query-attention" in args
    return ModelSays(
        blocks=stated("num-layers"),
        hidden=stated("hidden-size"),
        heads=stated("num-attention-heads"),
        kv_heads=stated("num-query-groups") if gqa else None,
        # each expert's MLP: --moe-ffn-hidden-size, else --ffn-hidden-size (Megatron-Core)
        ffn=(stated("moe-ffn-hidden-size") if "num-experts" in args else None)
        or stated("ffn-hidden-size")
        or _default_ffn(args, num),
        # a configuration stating its model without --num-experts builds a dense one
        experts=stated("num-experts")
        or (Stated(0, "no --num-experts") if "num-layers" in args else None),
        top_k=stated("moe-router-topk")  # Megatron-Core's default: 2
        or (Stated(2, "no --moe-router-topk") if "num-experts" in args else None),
        windows=windows_said(args, num("num-layers", 1), source) if "num-layers" in args else None,
        architecture=architecture_said(args, num, source),
        routing=_routing_said(args, num, source) if "num-experts" in args else None,
    )


def _routing_said(
    args: dict[str, str | None], num: Callable[[str, int], int], source: str
) -> tuple[int, int]:
    """(groups, groups per token) of `--moe-router-num-groups` / `--moe-router-group-topk`
    ((1, 1) without them: Megatron-Core's default routes over every expert); ValueError where
    megatron-core refuses them (one without the other, or more groups per token than groups)."""
    groups, top_k = num("moe-router-num-groups", 0), num("moe-router-group-topk", 0)
    if not groups and not top_k:
        return 1, 1
    if not groups or not 1 <= top_k <= groups:
        raise ValueError(
            f"{source}: --moe-router-num-groups {groups or '(none)'} with "
            f"--moe-router-group-topk {top_k or '(none)'}: give both, the second between 1 "
            "and the first"
        )
    return (1, 1) if top_k == groups else (groups, top_k)


_UNPRICED_VALUES = {
    "attention-backend": (("unfused", "local"), "priced as a fused attention kernel"),
    "transformer-impl": (("local",), "priced as Transformer Engine's layers"),
}
"""Values of Megatron-LM flags that change the step but that paraplan does not price: the
values, and what is priced instead."""


def _unpriced(
    args: dict[str, str | None],
    num: Callable[[str, int], int],
    source: str,
    recomputes: bool,
) -> list[str]:
    """Notes on what the arguments set that paraplan does not price; ValueError where
    Megatron-Core refuses the combination (`TransformerConfig.__post_init__`). `recomputes`:
    whether `read` found a recompute granularity (from any of the flags that set one)."""
    notes = []
    offload = num("cpu-offloading-num-layers", 0)
    if offload > 0:  # Megatron-LM turns `cpu_offloading` on with it (arguments.py)
        if num("pipeline-model-parallel-size", 1) > 1 or recomputes:
            raise ValueError(
                f"{source}: --cpu-offloading-num-layers {offload} with pipeline parallelism or "
                "recomputation: Megatron-Core refuses both; leave one out"
            )
        notes.append(
            f"--cpu-offloading-num-layers {offload} not priced: those layers' activations are "
            "counted as kept on the GPU, and their copies to the host as free"
        )
    if "disable-parameter-transpose-cache" in args and "fp8-format" in args:
        notes.append(
            "--disable-parameter-transpose-cache not priced: the weights' fp8 copies are "
            "counted as kept on the GPU and cast once per step"
        )
    if "fine-grained-activation-offloading" in args:
        notes.append("--fine-grained-activation-offloading not priced: activations kept")
    for key, (values, instead) in _UNPRICED_VALUES.items():
        if args.get(key) in values:
            notes.append(f"--{key} {args[key]} not priced: {instead}")
    if args.get("recompute-method") == "uniform" and num("recompute-num-layers", 1) > 1:
        notes.append(
            f"--recompute-method uniform --recompute-num-layers {args['recompute-num-layers']}: "
            "priced as every block keeping its input (Megatron keeps one input per group)"
        )
    return notes


def parse_args(text: str) -> dict[str, str | None]:
    """An argument file or launch script (shell words: ``#`` comments, backslash line ends,
    arrays and simple variables, `shell_words.script_words`) as flag -> value (None for a switch).
    Raises ValueError on a stray value or a flag paraplan reads given twice with two values
    (e.g. in both branches of an ``if``)."""
    words = script_words(text)
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
        elif (
            not eq
            and i + 1 < len(words)
            and not words[i + 1].startswith("--")
            and (key not in _SWITCHES or words[i + 1] in ("true", "True", "false", "False"))
        ):
            value, i = words[i + 1], i + 1
        said = value if (eq or value) else None
        if key in out and out[key] != said and key in _READ:
            raise ValueError(
                f"Megatron arguments: --{key} given twice, as {out[key]!r} and {said!r} (in "
                "both branches of an if?); keep the one that runs"
            )
        out[key] = said
        i += 1
    return out


def read(text: str, *, world_size: int, source: str) -> TrainerSetup:
    """A Megatron-LM argument file in the planner's terms, on `world_size` GPUs."""
    args = parse_args(text)
    notes: list[str] = []

    def num(key: str, default: int) -> int:
        """The flag's whole number (`default` when absent): at least 1, or 0 for the counts
        of layers that may be none (`_MAY_BE_ZERO`)."""
        raw = args.get(key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            unset = " (a shell variable the file does not set: write its value)" * ("$" in raw)
            raise ValueError(f"{source}: --{key} {raw!r} must be an integer{unset}") from None
        least = 0 if key in _MAY_BE_ZERO else 1
        if value < least:
            raise ValueError(f"{source}: --{key} {value} must be at least {least}")
        return value

    for key, allowed in _CHOICES.items():  # as Megatron-LM's argparse and TransformerConfig
        if key in args and args[key] not in allowed:
            raise ValueError(
                f"{source}: --{key} {args[key]!r}: Megatron takes one of {', '.join(allowed)}"
            )
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
    recompute, modules, pattern = Recompute.NONE, _CORE, None
    granularity = args.get("recompute-granularity")
    if "recompute-activations" in args:  # Megatron-LM: selective (arguments.py, validate_args)
        granularity = "selective"
    elif "checkpoint-activations" in args and granularity is None:
        granularity = "full"  # every layer (Megatron-LM before 2022; today's refuses the flag)
        notes.append(
            "--checkpoint-activations (Megatron-LM before 2022: every layer recomputed) read as "
            "--recompute-granularity full; today's Megatron-LM refuses it"
        )
    if granularity == "selective":
        recompute = Recompute.SELECTIVE
        given = "recompute-modules" in args  # given empty (nargs="*"): nothing recomputed
        named = str(args.get("recompute-modules") or "").split() if given else ["core_attn"]
        unknown = [m for m in named if m not in set(RecomputeModule)]
        if unknown:  # Megatron-Core's TransformerConfig asserts the same list
            raise ValueError(
                f"{source}: --recompute-modules {' '.join(unknown)}: Megatron-Core recomputes "
                f"only {', '.join(RecomputeModule)}; name modules from that list"
            )
        modules = tuple(RecomputeModule(m) for m in named)
        if RecomputeModule.MOE_ACT in modules and "moe-grouped-gemm" not in args:
            raise ValueError(
                f"{source}: --recompute-modules moe_act needs --moe-grouped-gemm (Megatron-Core "
                "refuses it otherwise); add --moe-grouped-gemm or leave moe_act out"
            )
        if RecomputeModule.SHARED_EXPERTS in modules and "moe-shared-expert-overlap" in args:
            raise ValueError(
                f"{source}: --recompute-modules shared_experts with --moe-shared-expert-overlap "
                "(Megatron-Core refuses the two together); leave one of them out"
            )
    elif granularity == "full":
        method, layers = args.get("recompute-method"), num("recompute-num-layers", 1)
        per_chunk = num("num-layers", 0) // (pp * vstages)
        recompute = Recompute.FULL
        if method == "block" and layers < per_chunk:
            recompute = Recompute.PER_LAYER
            pattern = RecomputePattern(PatternRule.FIRST_OF_CHUNK, layers)
            notes.append(f"--recompute-method block: {pattern.describe()}")
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
    flex = dispatcher == "flex"  # DeepEP or HybridEP (`--moe-flex-dispatcher-backend`)
    ep_dispatch = (EpDispatch.HIERARCHICAL if flex else EpDispatch.ALL_TO_ALL) if ep > 1 else None
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
    notes += _unpriced(args, num, source, granularity is not None)
    setup = TrainerSetup(
        target=Target.MEGATRON,
        strategy=strategy,
        global_batch=num("global-batch-size", mbs * dp),
        seq_len=num("seq-length", 0),
        precision=precision,
        notes=tuple(notes),
        runtime=Framework.NEMO if overlaps else Framework.MEGATRON,
        split=split,
        pattern=pattern,
        model_says=_model_says(args, num, source),
        mtp_layers=num("mtp-num-layers", 0),
        runtime_says=RuntimeSays(
            recompute_modules=modules if recompute == Recompute.SELECTIVE else _CORE,
            grad_reduce_overlap=grads_overlap,
            param_gather_overlap=params_overlap,
            fp32_grads="grad-reduce-in-bf16" not in args,
            glu_keeps_input_only="no-bias-swiglu-fusion" not in args,
            pp_comm_overlap="no-overlap-p2p-communication" not in args,
            fp8_all_gather=("fp8-param-gather" in args) if precision == Precision.FP8 else None,
            ep_dispatch=ep_dispatch,
        ),
    )
    return check_batch(setup)
