"""`paraplan compare`: plan the chosen strategy and named alternatives, write a report folder.

Thin: reads the model, cluster and training config as `paraplan plan` does, and calls
`paraplan.report.build_report`. Exit status: 0 when the report is written and at least one
strategy fits; 2 on bad input (message on stderr), or when no compared strategy fits (the
report is still written, and says why each does not).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from ..planner import limits
from ..planner.framework_pins import refuse_framework_cluster
from ..planner.frameworks import Framework, describe_runtime, is_own, mtp_layers
from ..planner.mtp import with_mtp
from .common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    add_input_args,
    add_no_progress_arg,
    add_recompute_modules_arg,
    add_runtime_arg,
    chosen_runtime,
    count_arg,
    format_bytes,
    parse_non_negative_int,
    parse_output_path,
    parse_positive_int,
    parse_seconds,
    progress_bar,
    read_cluster,
    read_model,
    runtime_name,
)

if TYPE_CHECKING:
    from ..report import ReportResult

DEFAULT_STRATEGIES = "plan,fsdp,megatron,dp-recompute,runners-up"
"""What `--strategies` compares unless told otherwise (every named strategy)."""
REASON_WIDTH = 100
"""Columns of the wrapped "why" lines under a strategy that does not fit or is not valid."""
DEFAULT_TRADEOFF = "store-all,sqrt-L,full-recompute,paraplan-dp"
"""Checkpointing strategies of the trade-off figure unless told otherwise (see
paraplan/report/compose.py DEFAULT_TRADEOFF for why the ILP is opt-in)."""


def add_parser(subparsers: Any) -> None:
    """Add the `compare` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "compare",
        help="compare the plan with named alternatives: a report with tables and plots",
        description="Plan the fastest strategy and named alternatives (pure FSDP, Megatron "
        "TP x PP, DP + full recompute, the runners-up) and write a report folder: README.md, "
        "a self-contained report.html with a table and plots (memory and time breakdowns, "
        "pipeline schedule Gantt charts, checkpointing time-vs-memory curves), and each "
        "strategy's plan JSON in plans/.",
    )
    add_input_args(p, "compare")
    p.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        metavar="LIST",
        help="comma list of plan, fsdp, megatron, dp-recompute, runners-up "
        f"(default {DEFAULT_STRATEGIES})",
    )
    p.add_argument(
        "--top",
        type=count_arg(limits.RUNNERS_UP, parse_non_negative_int),
        default=3,
        metavar="K",
        help="runners-up of the plan to compare (default 3)",
    )
    p.add_argument(
        "--tradeoff",
        default=DEFAULT_TRADEOFF,
        metavar="LIST",
        help="checkpointing strategies of the time-vs-memory figure: store-all, "
        "sqrt-L, full-recompute, paraplan-dp, paraplan-ilp (slow), or none "
        f"(default {DEFAULT_TRADEOFF})",
    )
    p.add_argument(
        "--tradeoff-budgets",
        type=count_arg(limits.TRADEOFF_BUDGETS, parse_positive_int),
        default=8,
        metavar="N",
        help="memory budgets per trade-off curve (default 8)",
    )
    p.add_argument(
        "--ilp-time-limit",
        type=parse_seconds,
        default=10.0,
        metavar="S",
        help="seconds per budget for paraplan-ilp (default 10)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=parse_output_path,
        required=True,
        metavar="DIR",
        help="report folder (created; an earlier report there is replaced)",
    )
    add_runtime_arg(
        p,
        "every compared strategy; another than paraplan plans them as that framework runs "
        "them (the plan and its runners-up within what it runs, the baselines as named)",
    )
    add_recompute_modules_arg(p)
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan compare` on parsed arguments; prints, returns the exit status."""
    from ..planner.config import TrainConfig

    # The report package pulls in the whole cost model and search (~0.2 s): only `compare`
    # pays for it, not every paraplan command's start-up.
    from ..report import (
        ReportOptions,
        build_report,
        parse_strategies,
        parse_tradeoff,
        report_step_count,
    )

    options = ReportOptions(  # bad lists and numbers fail before any tracing
        strategies=parse_strategies(args.strategies),
        top_k=args.top,
        tradeoff=parse_tradeoff(args.tradeoff),
        tradeoff_budgets=args.tradeoff_budgets,
        ilp_time_limit_s=args.ilp_time_limit,
    )
    if options.top_k < 0:
        raise ValueError(f"--top {options.top_k}: give 0 or more runners-up")
    if options.tradeoff_budgets < 1:
        raise ValueError(f"--tradeoff-budgets {options.tradeoff_budgets}: give at least 1")
    if not options.ilp_time_limit_s > 0:
        raise ValueError(f"--ilp-time-limit {options.ilp_time_limit_s}: give seconds > 0")
    cluster = read_cluster(args)
    runtime = chosen_runtime(args)  # with --recompute-modules, checked before any tracing
    refuse_framework_cluster(cluster, runtime)  # a GPU trainer on CPUs: before any tracing
    notes: list[str] = []
    if not is_own(runtime):
        notes.append(
            f"Every strategy is priced for {describe_runtime(runtime)}'s runtime (--runtime "
            f"{args.runtime}), not for paraplan's executor: `paraplan export` writes them for "
            "that framework; `paraplan run` refuses them."
        )
    framework = Framework(runtime_name(args))
    mtp_layers(args.mtp_layers, 0, framework, False)  # a bad --mtp-layers, before tracing
    profile, batch = read_model(args, notes)
    train = TrainConfig(
        global_batch=batch,
        seq_len=profile.seq_len,
        precision=args.precision,
        optimizer=args.optimizer,
        memory_headroom=args.memory_headroom,
        runtime=runtime,
        mtp_layers=mtp_layers(args.mtp_layers, profile.mtp_modules, framework, False),
    )
    profile = with_mtp(profile, train.mtp_layers)  # the modules trained, in the chain
    with progress_bar(args, desc="compare", total=report_step_count(options), unit="step") as bar:

        def on_step(label: str) -> None:
            bar.set_postfix_str(label)
            bar.update(1)

        result = build_report(
            args.output,
            profile=profile,
            cluster=cluster,
            train=train,
            options=options,
            notes=notes,
            on_step=on_step,
        )
    if not is_own(runtime):
        print(f"priced for {describe_runtime(runtime)}'s runtime (--runtime {args.runtime})")
    print(summary(result))
    if not any(e.fits for e in result.entries):
        print("paraplan: no compared strategy fits; the report says why", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def summary(result: ReportResult) -> str:
    """The compared strategies in a short table, and where the report went."""
    from ..planner.explain import tflops_text
    from ..planner.units import GIB, figure

    lines = [
        f"{'strategy':<22}{'step s':>9}{'tokens/s':>12}{'tok/s/GPU':>10}{'MFU':>7}"
        f"{'TFLOP/s/GPU':>12}{'GiB/GPU':>8}  status"
    ]
    for e in result.entries:
        if e.fits and e.plan is not None:
            pr = e.plan.predicted
            lines.append(
                f"{e.label:<22}{figure(pr.step_time_s, 3):>9}{pr.tokens_per_s:>12,.0f}"
                f"{pr.tokens_per_s / e.plan.cluster.num_gpus:>10,.0f}{pr.mfu:>7.1%}"
                f"{tflops_text(pr.model_flops_per_s_per_gpu):>12}"
                f"{figure(pr.memory_per_gpu_bytes / GIB):>8}  fits"
            )
        else:  # the status, and why on the lines below (as the report's table says)
            dashes = f"{'-':>9}{'-':>12}{'-':>10}{'-':>7}{'-':>12}{'-':>8}"
            need = (
                f" (needs at least {format_bytes(e.least_memory_bytes)} per GPU)"
                if e.least_memory_bytes is not None
                else ""
            )
            lines.append(f"{e.label:<22}{dashes}  {e.status}{need}")
            lines += textwrap.wrap(
                e.reason or "no reason recorded",
                width=REASON_WIDTH,
                initial_indent="    why: ",
                subsequent_indent=" " * len("    why: "),
            )
    figures = sum(1 for f in result.files if f.startswith("figures/") and f.endswith(".png"))
    plans = sum(1 for f in result.files if f.startswith("plans/"))
    lines += [
        "",
        f"report written to {result.folder}/ (README.md, report.html, {plans} plans, "
        f"{figures} figures)",
    ]
    return "\n".join(lines)
