"""`paraplan checkpoint`: which layers to recompute so one micro-batch's activations fit a
memory budget, at the least extra time.

The model becomes a chain of layers (a profile JSON written by `paraplan profile -o`, or a
Hugging Face preset/config traced on the meta device); the chain is solved by Rotor's dynamic
program (Beaumont et al. 2019, `--solver dp`, the default) or the Checkmate-style ILP (Jain et
al. 2020, `--solver ilp`). Layer times are the profile's measurements when it has them, else
the roofline of `--gpu` (FLOPs at peak times the catalog's matmul efficiency). The schedule
file format is the planner's (`planner.remat_schedule`).

Exit status: 0 with a schedule; 2 on bad input or when nothing fits the budget (the message
says the smallest budget that works and what to change).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import model_profile
from ..planner import limits
from .common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    Bar,
    add_no_progress_arg,
    check_output,
    count_arg,
    format_bytes,
    parse_bytes,
    parse_output_path,
    parse_positive_int,
    parse_seconds,
    print_notes,
    progress_bar,
)

if TYPE_CHECKING:
    from ..planner.model import ModelProfile
    from ..planner.remat_schedule import CheckpointSchedule
    from ..planner.solvers import LayerChain, OpGraph

DEFAULT_GPU = "h100"
"""Accelerator whose roofline times a profile without measured times."""


def add_parser(subparsers: Any) -> None:
    """Add the `checkpoint` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "checkpoint",
        help="choose the layers to recompute so activations fit a memory budget",
        description="Solve activation checkpointing for one micro-batch: which layers keep only "
        "their input and are recomputed before their backward, so the activation peak stays "
        "within --budget at the least extra time (Rotor DP or Checkmate-style ILP).",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="a profile JSON written by paraplan profile -o, a Hugging Face preset (gpt2, "
        "llama3-8b, ...) or config.json (traced on the meta device), or an analytic spec",
    )
    p.add_argument(
        "--budget",
        required=True,
        type=parse_bytes,
        metavar="SIZE",
        help="memory for one micro-batch's activations, their gradients and transients (not "
        "weights or optimizer state), e.g. 2GiB, 1500MB, 3.5G",
    )
    p.add_argument(
        "--seq-len",
        type=count_arg(limits.SEQ_LEN, parse_positive_int),
        metavar="S",
        help="tokens per sequence (default: the model's context length; a profile JSON has its "
        "own)",
    )
    p.add_argument(
        "--micro-batch",
        type=count_arg(limits.GLOBAL_BATCH, parse_positive_int),
        default=1,
        metavar="B",
        help="sequences per micro-batch (default 1)",
    )
    p.add_argument(
        "--solver",
        choices=["dp", "ilp"],
        default="dp",
        help="dp (default): Rotor's optimal persistent schedule; ilp: also drops and recomputes "
        "checkpoints (slower to solve)",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="time layers by this accelerator's roofline (default: the profile's measured "
        f"times, else {DEFAULT_GPU})",
    )
    p.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default="bf16",
        help="activation precision of a traced model (default bf16)",
    )
    p.add_argument(
        "--time-limit",
        type=parse_seconds,
        default=10.0,
        metavar="S",
        help="ILP time limit in seconds (default 10)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=parse_output_path,
        metavar="PATH",
        help="write the schedule JSON here",
    )
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan checkpoint` on parsed arguments; prints, returns the exit status."""
    from ..planner.remat_schedule import RematSolver, save_schedule

    check_output(args)  # an unwritable -o fails now, not after the solve
    steps = 3 + 2 * (RematSolver(args.solver) == RematSolver.ILP)
    with progress_bar(args, desc="checkpoint", total=steps, unit="step") as bar:
        solved = _solve(args, bar)
    if isinstance(solved, str):  # nothing fits the budget: the message says what does
        print(f"paraplan: error: {solved}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_schedule_summary(solved))
    if args.output:
        save_schedule(solved, args.output)
        print(f"\nschedule written to {args.output}")
    return EXIT_OK


def _solve(args: argparse.Namespace, bar: Bar) -> CheckpointSchedule | str:
    """Read the model, solve and replay the schedule, moving `bar` one step per stage (the
    model, the DP, for the ILP its solve and its least-budget solve, the replays); a budget
    below the least feasible peak returns the message that says so."""
    from ..planner.remat_schedule import (
        CheckpointSchedule,
        RematSolver,
        recomputations,
        schedule_steps,
    )
    from ..planner.solvers import (
        SolveStatus,
        min_peak_remat_ilp,
        simulate,
        solve_checkpoint_dp,
        solve_remat_ilp,
        store_all_ops,
    )

    def step(label: str) -> None:  # one stage done; `label` runs next
        bar.update(1)
        bar.set_postfix_str(label)

    bar.set_postfix_str(f"reading {args.model}")  # tracing imports torch first: seconds
    profile = _profile(args)
    chain, graph, times = _chain(profile, args)
    what = (
        f"{profile.name} (one micro-batch of {sequences(args.micro_batch)}, seq {profile.seq_len})"
    )
    budget = float(args.budget)
    solver = RematSolver(args.solver)
    step("solving (DP)")
    dp = solve_checkpoint_dp(chain, budget)
    # The ILP solves the profile's op graph when it has one (a traced model), else the chain.
    model: LayerChain | OpGraph = chain if graph is None else graph
    if solver == RematSolver.DP:
        sol = dp
    else:
        step(f"solving (ILP, at most {args.time_limit:g} s)")
        sol = solve_remat_ilp(model, budget, time_limit_s=args.time_limit)
    if sol.status == SolveStatus.TIME_LIMIT:
        raise ValueError(
            f"the ILP found no schedule for {what} within {format_bytes(budget)} in "
            f"{args.time_limit:g} s and proved nothing; raise --time-limit or use --solver dp"
        )
    if sol.status == SolveStatus.INFEASIBLE or not sol.ops:
        least = sol.min_budget_bytes if sol.min_budget_bytes is not None else dp.min_budget_bytes
        if args.micro_batch > 1:
            lower = "lower --micro-batch"
        else:
            lower = (
                "use a shorter sequence (--seq-len) or shard activations with tensor, sequence "
                "or context parallelism (paraplan plan)"
            )
        return (
            f"budget {format_bytes(budget)} is below the smallest feasible "
            f"peak {format_bytes(least, round_up=True)} for {what}: raise --budget to at least "
            f"{format_bytes(least, round_up=True)} or {lower}"
        )
    step("replaying")
    replay = simulate(model, sol.ops)
    store = simulate(model, store_all_ops(model))
    least = dp.min_budget_bytes
    if solver == RematSolver.ILP and graph is not None:
        step(f"least budget (ILP, at most {args.time_limit:g} s)")
        found, _ = min_peak_remat_ilp(graph, time_limit_s=args.time_limit)
        least = replay.peak_bytes if found is None else min(found, replay.peak_bytes)
    names = [n.name for n in graph.nodes[1:]] if model is graph else [x.name for x in chain.layers]
    bar.update(bar.total - bar.n)
    return CheckpointSchedule(
        model=profile.name,
        seq_len=profile.seq_len,
        micro_batch_size=args.micro_batch,
        times=times,
        solver=solver,
        status=SolveStatus(sol.status),
        budget_bytes=budget,
        peak_bytes=replay.peak_bytes,
        min_budget_bytes=least,
        store_all_peak_bytes=store.peak_bytes,
        makespan_s=replay.makespan_s,
        store_all_makespan_s=store.makespan_s,
        layers=tuple(names),
        recomputed=recomputations(sol.ops, len(names)),
        steps=schedule_steps(sol.ops),
    )


def _profile(args: argparse.Namespace) -> ModelProfile:
    """The model's profile: a profile JSON as written, or a traced/analytic model."""
    from ..planner.hf_presets import is_hf_model
    from ..planner.inputs import is_regular_file
    from ..planner.profile_io import load_profile

    path = Path(args.model)
    if path.suffix == ".json" and is_regular_file(path) and not is_hf_model(args.model):
        profile = load_profile(path)
        if args.seq_len and args.seq_len != profile.seq_len:
            raise ValueError(
                f"--seq-len {args.seq_len} differs from the profile's {profile.seq_len}; "
                "profile the model again at that sequence length (paraplan profile --seq-len)"
            )
        return profile
    notes: list[str] = []
    profile = model_profile(
        args.model, seq_len=args.seq_len, precision=args.precision, source="auto", notes=notes
    )
    print_notes(notes)
    return profile


def _chain(
    profile: ModelProfile, args: argparse.Namespace
) -> tuple[LayerChain, OpGraph | None, str]:
    """The solver chain, the op graph for `--solver ilp` on a traced profile (None for the DP
    or an analytic profile), and where their times come from."""
    from ..planner.hardware import get_accelerator
    from ..planner.solvers import chain_from_profile, graph_from_profile

    measured = all(x.fwd_time_s is not None and x.bwd_time_s is not None for x in profile.layers)
    if args.gpu is None and measured:
        times = f"measured on {profile.measured_on or 'the profiling device'}"
        spf = None
    else:
        acc = get_accelerator(args.gpu or DEFAULT_GPU)
        dtype = "fp32" if profile.act_dtype_bytes >= 4 else "bf16"
        spf = 1 / (acc.peak_flops_for(dtype) * acc.matmul_efficiency)
        times = f"{acc.name} roofline ({dtype}, {acc.matmul_efficiency:.0%} of peak)"
    chain = chain_from_profile(
        profile, micro_batch_size=args.micro_batch, seconds_per_flop=spf, name=profile.name
    )
    if args.solver != "ilp" or not profile.op_graphs:
        return chain, None, times
    from ..planner.solvers.remat_ilp import ILP_MAX_OPS

    balance = get_accelerator(args.gpu or DEFAULT_GPU)
    graph = graph_from_profile(
        profile,
        micro_batch_size=args.micro_batch,
        seconds_per_flop=spf,
        flops_per_byte=balance.peak_flops_for("bf16") / balance.memory_bw_bytes_per_s,
        name=profile.name,
    )
    if len(graph.compute_nodes) > ILP_MAX_OPS:
        raise ValueError(
            f"the op graph of {profile.name} has {len(graph.compute_nodes)} operations; the ILP "
            f"solves up to {ILP_MAX_OPS} in reasonable time: use --solver dp (the layer chain)"
        )
    return chain, graph, times


def _ranges(names: tuple[str, ...], picked: list[int]) -> str:
    """Layer indices as names, runs of consecutive layers shortened: ``block.0..5, head``."""
    parts = []
    i = 0
    while i < len(picked):
        j = i
        while j + 1 < len(picked) and picked[j + 1] == picked[j] + 1:
            j += 1
        first, last = names[picked[i]], names[picked[j]]
        if i == j:
            parts.append(first)
        else:
            stem, _, tail = last.rpartition(".")
            short = tail if stem and first.startswith(stem + ".") else last
            parts.append(f"{first}..{short}")
        i = j + 1
    return ", ".join(parts)


def format_schedule_summary(s: CheckpointSchedule) -> str:
    """What the schedule does, in a few lines."""
    from ..planner.solvers import SolveStatus

    recomputed = [i for i, n in enumerate(s.recomputed) if n > 0]
    stored = [i for i, n in enumerate(s.recomputed) if n == 0]
    proven = "optimal" if s.status == SolveStatus.OPTIMAL else "feasible, optimality not proven"
    lines = [
        f"{s.model}: one micro-batch of {sequences(s.micro_batch_size)}, seq {s.seq_len}, "
        f"{len(s.layers)} layers; "
        f"times {s.times}",
        f"solver {s.solver.value}: {proven}",
        f"peak   {format_bytes(s.peak_bytes)} of the {format_bytes(s.budget_bytes)} budget "
        f"(store-all {format_bytes(s.store_all_peak_bytes)}, smallest feasible "
        f"{format_bytes(s.min_budget_bytes)})",
        f"time   {s.makespan_s * 1e3:.2f} ms per micro-batch forward+backward, "
        f"{s.overhead:+.1%} over store-all ({s.store_all_makespan_s * 1e3:.2f} ms)",
    ]
    if recomputed:
        lines.append(
            f"recompute ({len(recomputed)} layers, input kept, forward run again before the "
            f"backward): {_ranges(s.layers, recomputed)}"
        )
        again = [i for i in recomputed if s.recomputed[i] > 1]
        if again:
            lines.append(
                "  recomputed more than once: "
                + ", ".join(f"{s.layers[i]} x{s.recomputed[i]}" for i in again)
            )
        lines.append(f"store all ({len(stored)} layers): {_ranges(s.layers, stored) or '-'}")
    else:
        lines.append("everything fits: no layer is recomputed")
    return "\n".join(lines)


def sequences(count: int) -> str:
    """``1 sequence``, ``8 sequences``: a micro-batch's size in words (never a bare number
    that could be read as a micro-batch count)."""
    return f"{count:,} sequence{'' if count == 1 else 's'}"
