"""The `paraplan` command line. Thin: parses arguments, calls the planner, prints.

Exit status: 0 on success; 2 on bad input or when no plan fits (the message says why and what
to change); a plan pinned with --fix that does not fit is still written, and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .planner.cluster import Cluster
    from .planner.model import ModelProfile

EXIT_BAD_INPUT = 2
_SUFFIXES = {"k": 2**10, "m": 2**20, "g": 2**30}
"""Count suffixes are binary, as token budgets are quoted: 16M tokens = 16 * 2**20."""


def _count(text: str) -> int:
    """An integer with an optional K/M/G suffix (e.g. 16M); argparse reports the error."""
    raw = text.strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if raw and raw[-1] in _SUFFIXES:
        scale, raw = _SUFFIXES[raw[-1]], raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count; use an integer such as 256, 16M or 4096K"
        ) from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return int(value)


def add_input_args(parser: argparse.ArgumentParser, verb: str) -> None:
    """The model, cluster and training-config arguments `plan` and `compare` share."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="M",
                        help="a preset (gpt2, gpt2-xl, gpt3-175b, llama3-8b, llama3-70b, "
                        "llama3-405b, mixtral-8x7b), a Hugging Face config.json, "
                        "'gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048', or a .json "
                        "spec file")  # fmt: skip
    source.add_argument(
        "--profile",
        metavar="PROFILE",
        help=f"{verb} from a profile JSON written by paraplan profile -o",
    )
    parser.add_argument(
        "--model-source",
        default="auto",
        choices=["auto", "trace", "spec"],
        help="auto (default): trace Hugging Face presets/configs on the meta "
        "device, analytic spec otherwise; trace; spec (analytic, no torch)",
    )
    parser.add_argument(
        "--cluster",
        metavar="C",
        help="'<N>x<accelerator>' (8xh100, 1024xa100-80gb) or a .json/.yaml file",
    )
    parser.add_argument("--gpus", type=_count, metavar="N", help="GPU count (with --gpu)")
    parser.add_argument("--gpu", metavar="NAME", help="accelerator name (with --gpus)")
    parser.add_argument(
        "--gpus-per-node", type=_count, metavar="G", help="GPUs per node (default 8)"
    )
    batch = parser.add_mutually_exclusive_group(required=True)
    batch.add_argument(
        "--global-batch", type=_count, metavar="N", help="sequences per optimizer step"
    )
    batch.add_argument(
        "--global-batch-tokens",
        type=_count,
        metavar="T",
        help="tokens per optimizer step (e.g. 16M); must be a multiple of --seq-len",
    )
    parser.add_argument(
        "--seq-len",
        type=_count,
        metavar="S",
        help="tokens per sequence (default: the model's context length)",
    )
    parser.add_argument(
        "--precision",
        default="bf16",
        choices=["bf16", "fp16", "fp32"],
        help="training precision (default bf16 mixed precision)",
    )
    parser.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adamw", "sgd", "adafactor", "adam8bit"],
        help="default adamw",
    )
    parser.add_argument(
        "--memory-headroom",
        type=float,
        default=0.1,
        metavar="F",
        help="fraction of GPU memory kept free (default 0.1)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paraplan",
        description="Plan how to parallelize the training of a large model, and why.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = sub.add_parser(
        "plan",
        help="search the parallelism space and write the fastest plan that fits",
        description="Search DP x ZeRO x TP(+SP) x PP(schedule) x CP x EP x micro-batch x "
        "recompute x mesh order; print the chosen plan, its memory and time, and the runners-up.",
    )
    add_input_args(plan, "plan")
    plan.add_argument("--fix", default="", metavar="K=V,...",
                      help="pin dimensions, e.g. tp=8,pp=8,dp=24,zero=1,mbs=2,schedule=1f1b,"
                      "recompute=full (keys: dp tp pp cp ep zero_stage|zero sequence_parallel|sp "
                      "virtual_stages|vpp micro_batch_size|mbs schedule recompute "
                      "offload_optimizer|offload)")  # fmt: skip
    plan.add_argument(
        "--top", type=int, default=3, metavar="K", help="runners-up to list (default 3)"
    )
    plan.add_argument("-o", "--output", metavar="PATH", help="write the plan JSON here")
    plan.add_argument(
        "--json", action="store_true", help="print the plan JSON on stdout instead of the table"
    )
    plan.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    prof = sub.add_parser(
        "profile", help="trace a model's training step into a per-layer profile",
        description="Per layer: FLOPs, parameters, bytes saved for backward, transient peaks, "
        "op graphs and (measure mode) forward/backward times.",
    )  # fmt: skip
    prof.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="a Hugging Face preset (gpt2, llama3-8b, ...) or config.json",
    )
    prof.add_argument("--batch", type=_count, default=1, metavar="B", help="sequences (default 1)")
    prof.add_argument(
        "--seq-len",
        type=_count,
        metavar="S",
        help="tokens per sequence (default: the model's context length)",
    )
    prof.add_argument(
        "--mode",
        default="meta",
        choices=["meta", "measure"],
        help="meta (default): nothing allocated, times from the roofline; "
        "measure: run on the CPU and time each layer",
    )
    prof.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="default bf16")
    prof.add_argument("-o", "--output", metavar="PATH", help="write the profile JSON here")
    prof.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    explain = sub.add_parser("explain", help="say in words what bounds a plan",
                             description="What bounds the plan (memory, bubble, communication) "
                             "and what the next-best alternative costs.")  # fmt: skip
    explain.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    run = sub.add_parser(
        "run", help="launch a training script under torchrun with the plan's world size",
        description="paraplan run plan.json -- train.py [args]: one process per planned device; "
        "the script finds the plan in the PARAPLAN_PLAN environment variable.",
    )  # fmt: skip
    run.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    run.add_argument("script", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]",
                     help="the training script and its arguments, after --")  # fmt: skip
    show = sub.add_parser("show", help="print a saved plan's table")
    show.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    from . import compare_cli, memory_cli  # they reuse this module's helpers

    compare_cli.add_parser(sub)
    memory_cli.add_parser(sub)
    return parser


def _progress_bar() -> object:
    """A one-line progress bar on stderr, shown only on a terminal."""
    if not sys.stderr.isatty():
        return None
    width = 30

    def update(frac: float) -> None:
        done = round(width * frac)
        end = "\n" if frac >= 1.0 else ""
        sys.stderr.write(f"\rsearching [{'#' * done}{'.' * (width - done)}] {frac:4.0%}{end}")
        sys.stderr.flush()

    return update


def read_cluster(args: argparse.Namespace) -> Cluster:
    """The cluster `--cluster` or `--gpus/--gpu` describe."""
    from .planner.cluster import make_cluster, parse_cluster

    if args.cluster and (args.gpus or args.gpu):
        raise ValueError("give either --cluster or --gpus with --gpu, not both")
    if args.cluster:
        return parse_cluster(args.cluster, gpus_per_node=args.gpus_per_node)
    if args.gpus and args.gpu:
        return make_cluster(args.gpu, args.gpus, gpus_per_node=args.gpus_per_node)
    raise ValueError("no cluster: give --cluster 8xh100 (or a file), or --gpus N --gpu NAME")


def read_model(args: argparse.Namespace, notes: list[str]) -> tuple[ModelProfile, int]:
    """The model profile (`--profile`, or `--model` traced or analytic) and the global batch in
    sequences (`--global-batch`, or `--global-batch-tokens` over the sequence length)."""
    from .api import model_profile
    from .planner.profile_io import load_profile

    if args.profile:
        profile = load_profile(args.profile)
        if args.seq_len and args.seq_len != profile.seq_len:
            raise ValueError(
                f"--seq-len {args.seq_len} differs from the profile's {profile.seq_len}; "
                "profile the model at the training sequence length"
            )
    else:
        profile = model_profile(
            args.model, seq_len=args.seq_len, precision=args.precision,
            source=args.model_source, progress=not args.no_progress and sys.stderr.isatty(),
            notes=notes,
        )  # fmt: skip
    seq = profile.seq_len
    if not args.global_batch_tokens:
        return profile, args.global_batch
    if args.global_batch_tokens % seq:
        raise ValueError(
            f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of the "
            f"sequence length {seq}; use a multiple such as {seq * max(1, args.global_batch_tokens // seq)}"
        )
    return profile, args.global_batch_tokens // seq


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from .api import plan as make
    from .planner.api import NoFeasiblePlanError
    from .planner.explain import format_plan
    from .planner.plan import save_plan
    from .planner.search import parse_fix

    cluster = read_cluster(args)
    fix = parse_fix(args.fix)  # bad --fix fails before any tracing
    notes: list[str] = []
    profile, batch = read_model(args, notes)
    for note in notes:
        print(f"paraplan: note: {note}", file=sys.stderr)
    seq = profile.seq_len
    progress = None if (args.no_progress or args.json) else _progress_bar()
    try:
        outcome = make(
            profile, cluster, global_batch=batch, seq_len=seq, precision=args.precision,
            optimizer=args.optimizer, memory_headroom=args.memory_headroom,
            fix=fix, top_k=args.top, progress=progress,  # type: ignore[arg-type]
        )  # fmt: skip
    except NoFeasiblePlanError as exc:
        print(f"paraplan: no plan fits: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    plan = outcome.plan
    if args.output:
        save_plan(plan, args.output)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(format_plan(plan))
        if args.output:
            print(f"\nplan written to {args.output}")
    if not plan.feasible:
        print(f"paraplan: the pinned plan does not fit: {plan.infeasible_reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from .planner.explain import format_profile
    from .planner.hf_presets import is_hf_model
    from .planner.profile_io import save_profile

    if not is_hf_model(args.model):
        raise ValueError(
            f"--model {args.model!r}: paraplan profile traces Hugging Face presets or config.json "
            "files (with model_type); profile other modules with paraplan.profile(model, inputs)"
        )
    import torch

    from .profiler.hf import profile_hf

    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    if args.mode == "measure" and args.dtype == "bf16":
        dtype = torch.float32  # CPU timing in fp32: bf16 matmuls on CPU are not representative
    result = profile_hf(
        args.model, seq_len=args.seq_len, batch=args.batch, dtype=dtype, mode=args.mode,
        progress=not args.no_progress and sys.stderr.isatty(),
    )  # fmt: skip
    print(format_profile(result))
    if args.output:
        save_profile(result, args.output)
        print(f"\nprofile written to {args.output}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from .planner.explain import explain
    from .planner.plan import load_plan

    print(explain(load_plan(args.plan)))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .executor.launch import run_plan

    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        raise ValueError("no training script: use paraplan run plan.json -- train.py [args]")
    return run_plan(args.plan, script[0], script[1:])


def _cmd_show(args: argparse.Namespace) -> int:
    from .planner.explain import format_plan
    from .planner.plan import load_plan

    print(format_plan(load_plan(args.plan)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `paraplan` console script."""
    args = _parser().parse_args(argv)
    from . import compare_cli, memory_cli

    commands = {"plan": _cmd_plan, "profile": _cmd_profile, "explain": _cmd_explain,
                "show": _cmd_show, "run": _cmd_run, "compare": compare_cli.run,
                "checkpoint": memory_cli.run}  # fmt: skip
    try:
        return commands[args.command](args)
    except ValueError as exc:
        print(f"paraplan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `paraplan plan ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
