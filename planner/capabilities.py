"""What the executor runs: one table read by the search (it returns runnable plans unless told
otherwise), by `paraplan run` (it refuses a plan before starting any rank) and by the executor
itself (`parallelize` refuses the same plans by the same words). No torch here.

Each `Capability` is one limit of the executor, with the rule in words and a check that names
the value and the fix. A strategy the executor runs passes every check; the rest of the search
space (the cost model prices it) is planned only with ``--any-engine``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import Optimizer, Precision
from .frameworks import describe_runtime, is_own
from .plan import Plan
from .strategy import Recompute, Schedule, Strategy

RUNNABLE_PRECISIONS = (Precision.FP32, Precision.BF16)
"""Precisions the executor trains in (fp16 needs loss scaling; fp8 needs fp8 linear layers)."""
RUNNABLE_OPTIMIZERS = (Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR)
"""Optimizers torch.optim has."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """What a capability check reads: the strategy and the few facts of model and training
    that limit the executor."""

    strategy: Strategy
    """Degrees and choices."""
    experts: int
    """MoE experts per block (0 for a dense model)."""
    dense_blocks: bool = False
    """Whether some blocks of a MoE model have no experts (DeepSeek's first blocks)."""
    precision: Precision
    """Training precision."""
    optimizer: Optimizer
    """Optimizer."""
    block_recompute: tuple[Recompute, ...] | None = None
    """Each block's recompute decision when known (a plan's), None in the search."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Capability:
    """One limit of the executor."""

    name: str
    """Short name (shown in tables and messages)."""
    rule: str
    """What the executor runs, in words."""
    check: Callable[[Job], str | None]
    """None when the job is runnable, else why not and the fix."""


def _precision(j: Job) -> str | None:
    return precision_gap(j.precision)


def precision_gap(precision: Precision) -> str | None:
    """Why the executor cannot train in `precision`, whatever the strategy (None: it can)."""
    if precision in RUNNABLE_PRECISIONS:
        return None
    if precision == Precision.FP8:
        return (
            "precision 'fp8' needs fp8 linear layers (torchao's Float8Linear or Transformer "
            "Engine) on a GPU with fp8 tensor cores, which the executor does not apply; use "
            "--precision bf16"
        )
    return (
        f"precision {str(precision)!r} needs loss scaling, which the executor does not do; "
        "use --precision bf16 or fp32"
    )


def _optimizer(j: Job) -> str | None:
    if j.optimizer in RUNNABLE_OPTIMIZERS:
        return None
    names = " or ".join(str(o) for o in RUNNABLE_OPTIMIZERS)
    return f"optimizer {str(j.optimizer)!r} is not in torch.optim; use --optimizer {names}"


def _offload(j: Job) -> str | None:
    s = j.strategy
    if not s.offload_optimizer or (s.zero_stage == 2 or s.offload_params):
        return None
    if s.zero_stage == 3:
        return (
            "offload_optimizer with zero_stage=3 and offload_params=false: optimizer offload "
            "runs through FSDP2's CPUOffloadPolicy, which keeps ZeRO-3's parameter shards on "
            "the host too; use --fix offload_params=true (or zero=2)"
        )
    return (
        f"offload_optimizer with zero_stage={s.zero_stage}: optimizer offload runs through "
        "FSDP2's CPUOffloadPolicy, which also shards gradients (ZeRO-2 or 3); use --fix zero=2"
    )


def _zero1(j: Job) -> str | None:
    s = j.strategy
    if s.zero_stage != 1 or s.ep == 1:
        return None
    return (
        f"zero_stage=1 with ep={s.ep}: ZeRO-1 shards optimizer states over data-parallel ranks "
        "that hold the same parameters, and expert parallelism gives them different experts; "
        "use --fix zero=2 (same traffic)"
    )


def _context(j: Job) -> str | None:
    s = j.strategy
    if s.cp == 1 or (s.pp == 1 and s.ep == 1):
        return None
    return (
        f"cp={s.cp} with pp={s.pp}, ep={s.ep}: context parallelism runs with data and tensor "
        "parallelism only; use --fix pp=1,ep=1 or --fix cp=1"
    )


def _experts(j: Job) -> str | None:
    s = j.strategy
    if not j.experts:
        return None
    if s.ep > 1 and j.dense_blocks:
        return (
            f"ep={s.ep} over a model whose first or other blocks have no experts: the "
            "executor shards the experts of every block (Mixtral's layout); use --fix ep=1, "
            "or `paraplan export` the plan to Megatron-LM (--moe-layer-freq)"
        )
    if s.tp == 1 and s.pp == 1 and s.cp == 1 and s.shard_dp == s.dp:
        return None
    return (
        f"a mixture-of-experts model with tp={s.tp}, pp={s.pp}, cp={s.cp}, dp_shard="
        f"{s.shard_dp}: MoE blocks run with data and expert parallelism (FSDP or DDP) only; "
        "use --fix tp=1,pp=1,cp=1"
    )


def _pipeline(j: Job) -> str | None:
    s = j.strategy
    if s.pp > 1 and s.schedule == Schedule.NONE:
        return (
            f"pp={s.pp} with schedule 'none': a pipeline needs a schedule; use --fix schedule=1f1b"
        )
    split = (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV)
    if s.schedule in split and s.fsdp_wrapped:
        # measured on gloo (tests/test_schedules_numerics.py): torch 2.13's deferred weight
        # gradients under FSDP2 leave gradients or the next step's weights wrong
        return (
            f"schedule {str(s.schedule)!r} with FSDP (zero_stage={s.zero_stage}, offload): "
            "torch's split backward does not yet give FSDP2 correct gradients; use "
            "--fix zero=1 (replicated weights) or a schedule without a split backward "
            "(--fix schedule=1f1b or interleaved_1f1b)"
        )
    v_shaped = (Schedule.ZBV, Schedule.DUALPIPEV)  # two chunks per rank in a V
    if s.schedule in v_shaped and s.virtual_stages != 2:
        return (
            f"schedule {str(s.schedule)!r} with virtual_stages={s.virtual_stages}: it runs "
            "exactly two chunks per rank in a V; use --fix vpp=2"
        )
    chunked = (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, *v_shaped)
    if s.virtual_stages > 1 and s.schedule not in chunked:
        return (
            f"virtual_stages={s.virtual_stages} needs schedule interleaved_1f1b, not "
            f"{str(s.schedule)!r}; use --fix schedule=interleaved_1f1b or vpp=1"
        )
    return None


def _powersgd(j: Job) -> str | None:
    s = j.strategy
    if s.powersgd_rank is None or (s.tp == 1 and s.pp == 1):
        return None
    return (
        f"powersgd_rank={s.powersgd_rank} with tp={s.tp}, pp={s.pp}: PowerSGD runs as DDP's "
        "communication hook, and with TP or PP the executor replicates with FSDP2's replicate, "
        "which takes no hook; use --fix tp=1,pp=1 or drop powersgd_rank"
    )


def _async_pipeline(j: Job) -> str | None:
    if not j.strategy.async_pipeline:
        return None
    return (
        "async_pipeline (PipeDream-2BW): torch.distributed.pipelining flushes the pipeline "
        "every step and keeps one weight version, so the executor cannot run it; plan without "
        "--allow-async (or with --any-engine to see its predictions only)"
    )


CAPABILITIES: tuple[Capability, ...] = (
    Capability(name="precision", rule="fp32 or bf16 (no loss scaling)", check=_precision),
    Capability(name="optimizer", rule="AdamW, SGD or Adafactor (torch.optim)", check=_optimizer),
    Capability(
        name="offload",
        rule="optimizer offload with ZeRO-2, or ZeRO-3 with its parameters (FSDP2)",
        check=_offload,
    ),
    Capability(
        name="zero-1",
        rule="ZeRO-1 with DP, TP, PP and CP, no EP (sharded optimizer states)",
        check=_zero1,
    ),
    Capability(
        name="context",
        rule="CP with DP and TP (no PP, no EP)",
        check=_context,
    ),
    Capability(name="moe", rule="MoE with DP and EP only (no TP, PP, CP or HSDP)", check=_experts),
    Capability(
        name="pipeline",
        rule=(
            "PP with GPipe, 1F1B, interleaved 1F1B, or (without FSDP) interleaved zero bubble, "
            "ZB-V or DualPipeV"
        ),
        check=_pipeline,
    ),
    Capability(name="powersgd", rule="PowerSGD with DDP (no TP, no PP)", check=_powersgd),
    Capability(
        name="async-pipeline",
        rule="no asynchronous pipeline (PipeDream-2BW): every step flushes",
        check=_async_pipeline,
    ),
)
"""Every limit of the executor (DP/FSDP/HSDP, TP/SP, PP, CP, EP, recompute otherwise run)."""


def runnable_shape(s: Strategy) -> tuple:
    """What `CAPABILITIES` read of a strategy beside its ZeRO stage, optimizer offload, parameter
    offload, schedule and virtual stages (for one model, precision and optimizer): whether
    each degree is 1, whether HSDP shards, whether FSDP2 would wrap a sharded ZeRO (dp * cp >
    1), PowerSGD and the asynchronous pipeline. Two strategies alike in these and in those
    five fields are runnable alike (tests/test_capabilities.py checks it over the search's
    spaces); the search asks once per shape (`search_blocks.runnable_choices`). Change it with
    any check that reads more."""
    return (
        s.tp == 1,
        s.pp == 1,
        s.cp == 1,
        s.ep == 1,
        s.shard_dp == s.dp,
        s.dp * s.cp > 1,
        s.powersgd_rank is None,
        s.async_pipeline,
        s.offload_params,
    )


def executor_gaps(job: Job) -> tuple[str, ...]:
    """Why the executor cannot run `job`, one message per limit it hits (empty: runnable)."""
    return tuple(msg for c in CAPABILITIES if (msg := c.check(job)) is not None)


def plan_gaps(plan: Plan) -> tuple[str, ...]:
    """`executor_gaps` of a plan, after the runtime it was priced for when not the executor's."""
    runtime = plan.train.runtime
    priced = (
        ()
        if is_own(runtime)
        else (
            f"it was priced for {describe_runtime(runtime)}'s runtime, not paraplan's executor, so "
            "its measured step would be compared with another framework's prices; plan it again "
            "without --runtime to run it here, or `paraplan export` it to that trainer",
        )
    )
    windows = plan.model.attention_windows
    windowed = (
        ()
        if not plan.model.windowed
        else (
            f"its model's attention has sliding windows ({sum(1 for w in windows if w)} of "
            f"{len(windows)} blocks see {max(windows)} keys or fewer), which the executor "
            "would run as full causal attention (it passes its blocks no mask): another model "
            "than the one priced; `paraplan export` the plan to Megatron-LM (--window-size) "
            "or run it in a trainer that keeps the window",
        )
    )
    mtp = plan.train.mtp_layers
    predicting = (
        ()
        if not mtp
        else (
            f"it trains {mtp} multi-token-prediction module(s) after the blocks, which the "
            "executor does not build (it runs the model's own forward and loss); plan with "
            "--mtp-layers 0 to run it here, or `paraplan export` it to Megatron-LM",
        )
    )
    return (
        priced
        + windowed
        + predicting
        + executor_gaps(
            Job(
                strategy=plan.strategy(),
                experts=plan.model.experts,
                dense_blocks=bool(plan.model.dense_blocks),
                precision=plan.train.precision,
                optimizer=plan.train.optimizer,
                block_recompute=tuple(
                    d.recompute for d in plan.layers if d.name.startswith("block")
                ),
            )
        )
    )
