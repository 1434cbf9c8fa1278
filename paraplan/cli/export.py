"""`paraplan export PLAN --to torchtitan|megatron|deepspeed`: write a plan as the trainer's
configuration (a torchtitan job-config TOML, Megatron-LM `pretrain_gpt.py` arguments, a
DeepSpeed `ds_config.json`).

What the trainer cannot express is mapped to its nearest with a warning on stderr and the
predicted cost of the difference, or refused. Exit status: 0 (also with warnings); 2 on bad
input, or when the trainer has nothing near a feature of the plan (the message names it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import EXIT_OK


def add_parser(subparsers: Any) -> None:
    """Add the `export` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "export",
        help="write a plan as a torchtitan, Megatron-LM or DeepSpeed configuration",
        description="Write a plan as a trainer's configuration; what the trainer cannot "
        "express is mapped to its nearest (with a warning and its predicted cost) or refused.",
    )
    p.add_argument("plan", metavar="PLAN", help="a plan JSON written by paraplan plan -o")
    p.add_argument(
        "--to", required=True, choices=["torchtitan", "megatron", "deepspeed"], help="the trainer"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument(
        "--model",
        metavar="M",
        help="the model the plan was made from, to price what the trainer cannot express "
        "(default: the plan's model name)",
    )
    p.add_argument("--profile", metavar="PROFILE", help="or its profile JSON")
    p.add_argument(
        "--model-source",
        default="auto",
        choices=["auto", "trace", "spec"],
        help="how to rebuild --model (default auto)",
    )
    p.add_argument("--cluster", metavar="C", help="the plan's cluster (default: its name)")
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan export` on parsed arguments; prints, returns the exit status."""
    from ..export.exporter import costing_for, export_plan
    from ..export.setup import Target
    from ..planner.jsonio import write_atomic
    from ..planner.plan_io import load_plan

    plan = load_plan(args.plan)
    exported = export_plan(
        plan,
        Target(args.to),
        lambda: costing_for(
            plan,
            model=args.model,
            profile_path=args.profile,
            cluster=args.cluster,
            source=args.model_source,
        ),
    )
    if exported.approximation is not None:
        for line in exported.approximation.describe():
            print(f"paraplan: warning: {args.to}: {line}", file=sys.stderr)
    if args.output:
        write_atomic(args.output, exported.text)
        print(f"{args.to} config written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(exported.text)
    return EXIT_OK
