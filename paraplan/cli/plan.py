"""`paraplan plan`: search the parallelism space and print (or write) the fastest plan that fits.

Exit status: 0 on success; 2 on bad input or when no plan fits (the message says why and what
to change); a plan pinned with --fix that does not fit is still written, and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..api import plan as make
from ..planner import limits
from .common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    add_input_args,
    add_no_progress_arg,
    add_recompute_modules_arg,
    add_runtime_arg,
    check_output,
    chosen_runtime,
    closing_callback,
    count_arg,
    fraction_callback,
    parse_non_negative_int,
    parse_output_path,
    progress_bar,
    read_cluster,
    read_model,
    runtime_name,
)

FIX_HELP = (
    "pin dimensions, e.g. tp=8,pp=8,dp=24,zero=1,mbs=2,schedule=1f1b,recompute=full (keys: dp "
    "tp pp cp ep zero_stage|zero sequence_parallel|sp virtual_stages|vpp micro_batch_size|mbs "
    "schedule recompute offload_optimizer|offload powersgd_rank|powersgd offload_params "
    "offload_activations|offload_acts async_pipeline|async)"
)
"""What `--fix` accepts (the keys `planner.pins.Pins.parse` knows)."""


def add_parser(subparsers: Any) -> None:
    """Add the `plan` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "plan",
        help="search the parallelism space and write the fastest plan that fits",
        description="Search DP x ZeRO x TP(+SP) x PP(schedule) x CP x EP x micro-batch x "
        "recompute x mesh order; print the chosen plan, its memory and time, and the runners-up.",
        epilog="A large search uses up to 4 of the usable cores on Linux (the same plan as one "
        "process); PARAPLAN_SEARCH_WORKERS=1 keeps it to one process, =N uses N.",
    )
    add_input_args(p, "plan", batch_required=False)
    p.add_argument(
        "--from-config",
        metavar="FILE",
        help="judge a trainer config against the best plan: a torchtitan TOML, a DeepSpeed "
        "JSON, a Megatron-LM argument file, or torchtitan:MODULE.CONFIG (batch from the config)",
    )
    p.add_argument("--fix", default="", metavar="K=V,...", help=FIX_HELP)
    p.add_argument(
        "--top",
        type=count_arg(limits.RUNNERS_UP, parse_non_negative_int),
        default=3,
        metavar="K",
        help="runners-up to list (default 3)",
    )
    p.add_argument(
        "-o", "--output", type=parse_output_path, metavar="PATH", help="write the plan JSON here"
    )
    p.add_argument(
        "--json", action="store_true", help="print the plan JSON on stdout instead of the table"
    )
    p.add_argument(
        "--any-engine",
        action="store_true",
        help="search every strategy the cost model prices, also those paraplan's executor "
        "does not run (the output says which)",
    )
    p.add_argument(
        "--allow-compression",
        action="store_true",
        help="also search PowerSGD gradient compression (ranks 1, 2, 4, 8; DDP/ZeRO-1): it "
        "changes the training math (low-rank gradients with error feedback)",
    )
    p.add_argument(
        "--allow-async",
        action="store_true",
        help="also search the asynchronous PipeDream-2BW pipeline (no flush): it changes the "
        "training semantics (weight staleness 1); paraplan's executor does not run it",
    )
    add_runtime_arg(
        p,
        "the plan; another than paraplan searches every strategy that framework runs, as "
        "--any-engine, and the plan is for `paraplan export`; with --from-config the default "
        "is the trainer's own runtime as its configuration states it",
    )
    add_recompute_modules_arg(p)
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan plan` on parsed arguments; prints, returns the exit status."""
    from ..planner.api import NoFeasiblePlanError, refuse_precision
    from ..planner.capabilities import plan_gaps
    from ..planner.config import Precision
    from ..planner.cost.rules import cluster_violation
    from ..planner.explain import format_plan
    from ..planner.framework_pins import framework_pins, mtp_pins, refuse_framework_cluster
    from ..planner.frameworks import Framework, is_own, mtp_layers
    from ..planner.jsonio import dumps_finite
    from ..planner.options import Consent
    from ..planner.pins import Pins
    from ..planner.plan_io import save_plan
    from ..planner.search_workers import workers_from_env

    check_output(args)  # an unwritable -o fails now, not after the search
    workers_from_env()  # a bad PARAPLAN_SEARCH_WORKERS too

    if args.from_config:  # judge an existing trainer config (paraplan/export/judge.py)
        from ..export.judge import run_from_config

        with progress_bar(args, desc="searching", total=100, unit="%") as bar:
            fits = run_from_config(args, read_cluster, read_model, closing_callback(bar))
        return EXIT_OK if fits else EXIT_BAD_INPUT
    if not (args.global_batch or args.global_batch_tokens):
        raise ValueError("give --global-batch N or --global-batch-tokens T (or --from-config)")
    cluster = read_cluster(args)
    if cluster.calibration is not None:  # measured on another kind of device: say so
        mismatch = cluster.calibration.device_mismatch(cluster.accelerator.name)
        if mismatch:
            print(f"paraplan: warning: {mismatch}", file=sys.stderr)
        unsteady = cluster.calibration.unsteady_note()
        if unsteady:
            print(f"paraplan: note: {unsteady}", file=sys.stderr)
    # fp8 without fp8 tensor cores, or a precision the executor does not run: before tracing
    runtime = chosen_runtime(args, allow_auto=True)  # a bad --recompute-modules: before tracing
    framework = Framework(runtime_name(args))
    mtp_layers(args.mtp_layers, 0, framework, args.any_engine)  # and a bad --mtp-layers
    refuse_precision(cluster, Precision(args.precision), args.any_engine or not is_own(runtime))
    fix = Pins.parse(args.fix)  # bad --fix fails before any tracing
    consent = Consent(compression=args.allow_compression, async_pipeline=args.allow_async)
    refuse_framework_cluster(cluster, runtime)  # a GPU trainer on CPUs
    framework_pins(fix, runtime, consent)  # and pins it cannot run
    mtp_pins(fix, runtime, args.mtp_layers or 0)  # or cannot run with the modules asked
    broken = cluster_violation(cluster.num_gpus, fix)  # and degrees the cluster cannot hold
    if broken is not None:
        named = fix.describe(broken.rule.fields) or fix.describe()
        raise ValueError(f"--fix {named}: {broken.message} (rule {broken.rule})")
    profile, batch = read_model(args, [])
    try:
        with progress_bar(
            args, desc="searching", total=100, unit="%", enabled=not args.json
        ) as bar:
            outcome = make(
                profile,
                cluster,
                global_batch=batch,
                seq_len=profile.seq_len,
                precision=args.precision,
                optimizer=args.optimizer,
                memory_headroom=args.memory_headroom,
                fix=fix,
                top_k=args.top,
                progress=fraction_callback(bar),
                any_engine=args.any_engine,
                allow_compression=args.allow_compression,
                allow_async=args.allow_async,
                runtime=runtime_name(args),
                recompute_modules=args.recompute_modules,
                ep_dispatch=args.ep_dispatch,
                mtp_layers=args.mtp_layers,
            )
    except NoFeasiblePlanError as exc:
        print(f"paraplan: no plan fits: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    plan = outcome.plan
    if args.output:
        save_plan(plan, args.output)
    if args.json:
        print(dumps_finite(plan.to_dict(), "plan"), end="")  # NaN is not JSON: refused
    else:
        print(format_plan(plan))
        for gap in plan_gaps(plan):
            print(f"executor: paraplan run cannot run this plan: {gap}")
        if args.output:
            print(f"\nplan written to {args.output}")
    if not plan.feasible:
        print(f"paraplan: the pinned plan does not fit: {plan.infeasible_reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK
