"""`paraplan profile`: trace a Hugging Face model's training step into a per-layer profile
(FLOPs, parameters, saved bytes, transient peaks, op graphs; measured times in measure mode).

Exit status: 0 with a profile; 2 on bad input (the message says what to change).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..planner import limits
from .common import (
    EXIT_OK,
    add_no_progress_arg,
    check_output,
    count_arg,
    parse_output_path,
    progress_bar,
    show_progress,
)


def add_parser(subparsers: Any) -> None:
    """Add the `profile` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "profile",
        help="trace a model's training step into a per-layer profile",
        description="Per layer: FLOPs, parameters, bytes saved for backward, transient peaks, "
        "op graphs and (measure mode) forward/backward times.",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="a Hugging Face preset (gpt2, llama3-8b, ...) or config.json",
    )
    p.add_argument(
        "--batch",
        type=count_arg(limits.GLOBAL_BATCH),
        default=1,
        metavar="B",
        help="sequences (default 1)",
    )
    p.add_argument(
        "--seq-len",
        type=count_arg(limits.SEQ_LEN),
        metavar="S",
        help="tokens per sequence (default: the model's context length)",
    )
    p.add_argument(
        "--mode",
        default="meta",
        choices=["meta", "measure"],
        help="meta (default): nothing allocated, times from the roofline; "
        "measure: run on the CPU and time each layer",
    )
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="default bf16")
    p.add_argument(
        "-o", "--output", type=parse_output_path, metavar="PATH", help="write the profile JSON here"
    )
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan profile` on parsed arguments; prints, returns the exit status."""
    from ..planner.explain import format_profile
    from ..planner.hf_presets import is_hf_model
    from ..planner.profile_io import save_profile

    check_output(args)  # an unwritable -o fails now, not after the trace
    if args.seq_len is not None:  # the tracer makes batch x seq token ids on the CPU
        limits.PROFILE_TOKENS.check(args.batch * args.seq_len, "--batch x --seq-len")
    if not is_hf_model(args.model):
        raise ValueError(
            f"--model {args.model!r}: paraplan profile traces Hugging Face presets or config.json "
            "files (with model_type); profile other modules with paraplan.profile(model, inputs)"
        )
    with progress_bar(args, desc="profile", total=2, unit="step") as bar:
        bar.set_postfix_str("importing torch and transformers")  # seconds before the trace
        import torch

        from ..executor.convert import executed_module
        from ..profiler.hf import profile_hf

        bar.update(1)
        bar.set_postfix_str(f"tracing {args.model}")
        dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
        if args.mode == "measure" and args.dtype == "bf16":
            dtype = torch.float32  # CPU timing in fp32: bf16 matmuls on CPU are not representative
        result = profile_hf(
            args.model,
            seq_len=args.seq_len,
            batch=args.batch,
            dtype=dtype,
            mode=args.mode,
            progress=show_progress(args),  # the profiler's own bar, below this one
            as_run=executed_module,  # the module the executor runs
        )
        bar.update(1)
    print(format_profile(result))
    if args.output:
        save_profile(result, args.output)
        print(f"\nprofile written to {args.output}")
    return EXIT_OK
