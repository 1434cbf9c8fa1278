"""`paraplan plan --from-config FILE`: a trainer's configuration evaluated pinned under the
cost model, beside the best plan, with the difference in words."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..planner.api import NoFeasiblePlanError, make_plan
from ..planner.cluster import Cluster
from ..planner.config import TrainConfig
from ..planner.cost.layout import StageSplit
from ..planner.explain import explain, tflops_text
from ..planner.framework_pins import refuse_framework_cluster
from ..planner.frameworks import MODULE_RECOMPUTE, RUNTIMES, Framework, runtime_note
from ..planner.inputs import read_text
from ..planner.model import ModelProfile
from ..planner.plan import Plan
from ..planner.strategy import Schedule
from . import deepspeed, megatron, torchtitan
from .setup import Target, TrainerSetup

REGISTRY_PREFIX = "torchtitan:"
"""`--from-config torchtitan:MODULE.CONFIG` reads a configuration shipped in torchtitan."""
SUFFIXES = {".toml": Target.TORCHTITAN, ".json": Target.DEEPSPEED}
"""Trainer by file suffix; any other file is read as Megatron-LM arguments."""
_GB = 2**30


def read_config(source: str, *, world_size: int) -> TrainerSetup:
    """A trainer configuration (a torchtitan TOML, a DeepSpeed JSON, a Megatron-LM argument
    file, or ``torchtitan:MODULE.CONFIG``) in the planner's terms, on `world_size` GPUs."""
    if source.startswith(REGISTRY_PREFIX):
        return torchtitan.read_registry(source[len(REGISTRY_PREFIX) :], world_size=world_size)
    target = SUFFIXES.get(Path(source).suffix.lower(), Target.MEGATRON)
    hint = f"give a {target} configuration (docs/export.md)"
    text = read_text(source, what=f"{target} configuration", hint=hint)  # size, UTF-8, no FIFO
    if target == Target.TORCHTITAN:
        return torchtitan.read_toml(text, world_size=world_size, source=source)
    if target == Target.DEEPSPEED:
        return deepspeed.read(text, world_size=world_size, source=source)
    return megatron.read(text, world_size=world_size, source=source)


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """A trainer configuration evaluated pinned, and the best plan for the same job."""

    source: str
    """Where the configuration came from."""
    setup: TrainerSetup
    """What it says."""
    yours: Plan
    """It, evaluated with every dimension pinned (marked infeasible when it does not fit)."""
    best: Plan | None
    """The best plan the search finds for the same model, cluster and batch (None: none fits)."""


def compare(
    source: str,
    setup: TrainerSetup,
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    *,
    top_k: int = 3,
    progress: Callable[[float], None] | None = None,
) -> Comparison:
    """Evaluate `setup` pinned and search the best plan for the same job; `progress(fraction)`
    follows the search (the pinned evaluation is quick)."""
    # any engine: the configuration runs on its own trainer, not on paraplan's executor;
    # within the framework's space where it lies there (a trainer with a fixed mesh order,
    # Megatron-LM's, runs yours in that order), else as it is (a recompute mix the space
    # leaves out: its mesh order is then the fastest)
    split = setup.split or StageSplit.BALANCED  # the trainer's own split of the blocks

    def priced(*, within_framework: bool = True) -> Plan:
        return make_plan(
            profile,
            cluster,
            train,
            pins=setup.pins(),
            top_k=0,
            any_engine=True,
            within_framework=within_framework,
            split=split,
            pattern=setup.pattern,  # the blocks it recomputes, where it names them
        ).plan

    try:
        yours = priced()
    except NoFeasiblePlanError:
        raise
    except ValueError:  # outside the framework's space
        yours = priced(within_framework=False)
    try:
        best: Plan | None = make_plan(
            profile, cluster, train, top_k=top_k, any_engine=True, progress=progress
        ).plan
    except NoFeasiblePlanError:
        best = None
    return Comparison(source=source, setup=setup, yours=yours, best=best)


def format_comparison(c: Comparison) -> str:
    """Your configuration beside the best plan, then what the difference is made of."""
    y, b = c.yours, c.best
    t = y.train
    head = [
        f"paraplan: your {c.setup.target} config ({c.source}) vs the best plan for {y.model.name} "
        f"on {y.cluster.name}",
        f"          global batch {t.global_batch} x {t.seq_len} tokens, {t.precision}, "
        f"{t.optimizer}" + runtime_note(t.runtime),
        "",
    ]
    w = max(44, len(y.short()) + 2)
    head.append(f"  {'':<16}{'yours':<{w}}best")
    rows = [("strategy", lambda p: p.short()), *_ROWS]
    for name, get in rows:
        head.append(f"  {name:<16}{get(y):<{w}}{get(b) if b else '-'}")
    if not y.feasible:
        head.append(f"\nYour configuration does NOT fit: {y.infeasible_reason}.")
    head += ["", *_difference(y, b)]
    if c.setup.notes:
        head += ["", "Read from the config:"] + [f"  - {n}" for n in c.setup.notes]
    bounds = [x for x in explain(y).splitlines() if not x.startswith("No runner-up")]
    head += ["", "What bounds your configuration:", *("  " + x for x in bounds)]
    return "\n".join(head)


def _mem(p: Plan) -> str:
    pr = p.predicted
    return f"{pr.memory_per_gpu_bytes / _GB:.1f} of {pr.memory_capacity_bytes / _GB:.1f} GiB"


_ROWS = [
    ("step time", lambda p: f"{p.predicted.step_time_s:.3f} s"),
    ("tokens/s", lambda p: f"{p.predicted.tokens_per_s:,.0f}"),
    ("  per GPU", lambda p: f"{p.predicted.tokens_per_s / p.cluster.num_gpus:,.0f}"),
    ("MFU", lambda p: f"{p.predicted.mfu:.1%}"),
    ("TFLOP/s/GPU", lambda p: tflops_text(p.predicted.model_flops_per_s_per_gpu)),
    ("memory per GPU", _mem),
    ("compute", lambda p: f"{p.predicted.time_breakdown.compute_s:.3f} s"),
    ("recompute", lambda p: f"{p.predicted.time_breakdown.recompute_s:.3f} s"),
    ("exposed comm", lambda p: f"{p.predicted.time_breakdown.comm_s:.3f} s"),
    ("bubble", lambda p: f"{p.predicted.time_breakdown.bubble_s:.3f} s"),
    ("optimizer", lambda p: f"{p.predicted.time_breakdown.optimizer_s:.3f} s"),
]
"""Rows of the side-by-side table."""
_PARTS = ("compute", "recompute", "comm", "bubble", "optimizer")


def _difference(y: Plan, b: Plan | None) -> list[str]:
    """The difference in words: how much faster the best is, which time terms make it up,
    and which choices differ."""
    if b is None:
        return ["No plan fits this model, cluster and batch; the search found nothing better."]
    ys, bs = y.predicted.step_time_s, b.predicted.step_time_s
    same_split = y.chunk_blocks() == b.chunk_blocks()
    if (y.short() == b.short() and same_split) or abs(ys - bs) <= 1e-9 * ys:
        return ["Your configuration is the best plan the search finds."]
    lines = [
        f"The best plan takes {bs:.3f} s per step against your {ys:.3f} s: "
        f"{ys / bs - 1:.1%} more throughput ({ys - bs:+.3f} s per step saved)."
        if bs < ys
        else f"Your configuration is predicted {bs / ys - 1:.1%} faster than the best plan that "
        "fits (it may not fit: see above)."
    ]
    yt, bt = y.predicted.time_breakdown, b.predicted.time_breakdown
    deltas = sorted(
        ((getattr(yt, f"{k}_s") - getattr(bt, f"{k}_s"), k) for k in _PARTS), reverse=True
    )
    terms = [f"{k} {d:+.3f} s" for d, k in deltas if abs(d) >= 0.0005]
    if terms:
        lines.append("  where your step spends more (+) or less (-): " + ", ".join(terms))
    ys_, bs_ = y.strategy(), b.strategy()
    changes = []
    for field in ("dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size", "virtual_stages"):
        if getattr(ys_, field) != getattr(bs_, field):
            changes.append(f"{field} {getattr(ys_, field)} -> {getattr(bs_, field)}")
    for field in ("sequence_parallel", "offload_optimizer", "schedule", "recompute"):
        if getattr(ys_, field) != getattr(bs_, field):
            changes.append(f"{field} {getattr(ys_, field)} -> {getattr(bs_, field)}")
    ysh, bsh = y.parallelism.dp_shard, b.parallelism.dp_shard
    if (ysh < ys_.dp or bsh < bs_.dp) and ysh != bsh:  # HSDP on either side (else it is dp)
        changes.append(f"dp_shard {ysh} -> {bsh}")
    if not same_split and ys_.pp == bs_.pp and ys_.virtual_stages == bs_.virtual_stages:
        yours, best = (",".join(map(str, p.chunk_blocks())) for p in (y, b))
        changes.append(f"blocks per pipeline chunk {yours} -> {best}")
    if changes:
        lines.append("  what the best plan changes: " + ", ".join(changes))
    return lines


def judged_runtime(asked: str | None, setup: TrainerSetup, cluster: Cluster) -> Framework:
    """The runtime a configuration is judged on: `--runtime` where given; else the trainer's
    own as its configuration states it (`TrainerSetup.runtime`: Megatron-LM's, NeMo's with
    `--tp-comm-overlap`, torchtitan's eager or compiled), so that your configuration and the
    best plan are priced as that trainer runs them; paraplan's executor's for a trainer
    without a preset (DeepSpeed) and on a CPU cluster (the trainers train on GPUs)."""
    if asked is not None:
        return Framework(asked)
    if setup.runtime is None or cluster.accelerator.is_host:
        return Framework.PARAPLAN
    return setup.runtime


def run_from_config(
    args: argparse.Namespace,
    read_cluster: Callable[[argparse.Namespace], Cluster],
    read_model: Callable[[argparse.Namespace, list[str]], tuple[ModelProfile, int]],
    progress: Callable[[float], None] | None = None,
) -> bool:
    """`paraplan plan --from-config FILE` on parsed `plan` arguments, with the command line's
    readers of the cluster and model; prints the comparison and returns whether your
    configuration fits. `progress(fraction)` follows the search for the best plan."""
    cluster = read_cluster(args)
    setup = read_config(args.from_config, world_size=cluster.num_gpus)
    if getattr(args, "recompute_modules", None) is not None:
        raise ValueError(
            "--from-config takes the recompute modules from the config; leave out "
            "--recompute-modules"
        )
    if args.global_batch or args.global_batch_tokens:
        raise ValueError(
            "--from-config takes the global batch from the config; leave out --global-batch"
        )
    if setup.seq_len is not None:
        if args.seq_len and args.seq_len != setup.seq_len:
            raise ValueError(
                f"--seq-len {args.seq_len} differs from the config's {setup.seq_len}; "
                "leave out --seq-len"
            )
        args.seq_len = setup.seq_len
    args.global_batch, args.precision = setup.global_batch, str(setup.precision)
    framework = judged_runtime(getattr(args, "runtime", None), setup, cluster)
    runtime = RUNTIMES[framework]
    if setup.runtime_says is not None and framework in MODULE_RECOMPUTE:  # as configured
        runtime = setup.runtime_says.apply(runtime)
    refuse_framework_cluster(cluster, runtime)  # an explicit GPU trainer's --runtime on CPUs
    profile, batch = read_model(args, [])
    if setup.model_says is not None:  # a configuration priced on its own model only
        problem = setup.model_says.mismatch(profile)
        if problem is not None:
            raise ValueError(f"{args.from_config}: {problem}")
        profile, routed = setup.model_says.routed(profile)  # its routing, as it runs
        if routed is not None:
            setup = replace(setup, notes=(*setup.notes, routed))
    split = setup.split
    if split is not None:  # the trainer's own split of the blocks, checked before a search
        s = setup.strategy
        try:
            looped = s.schedule not in (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
            v = split.virtual_stages(profile.num_blocks, s.pp, looped=looped)
            if v is not None:  # torchtitan's layers per stage: its chunk count
                s = replace(s, virtual_stages=v)
                setup = replace(setup, strategy=s)
            split.counts(profile.num_blocks, s.pp, s.virtual_stages, mtp=setup.mtp_layers)
        except ValueError as exc:
            raise ValueError(f"{args.from_config}: {exc}") from None
    train = TrainConfig(
        global_batch=batch,
        seq_len=profile.seq_len,
        precision=setup.precision,
        optimizer=args.optimizer,
        memory_headroom=args.memory_headroom,
        runtime=runtime,
        mtp_layers=setup.mtp_layers,
    )
    comparison = compare(
        args.from_config, setup, profile, cluster, train, top_k=args.top, progress=progress
    )
    print(format_comparison(comparison))
    if not comparison.yours.feasible:
        print(
            f"paraplan: your configuration does not fit: {comparison.yours.infeasible_reason}",
            file=sys.stderr,
        )
    return comparison.yours.feasible
