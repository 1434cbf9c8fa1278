"""What the `paraplan` commands share: exit codes, argument types (counts, memory sizes), the
model/cluster/training-config input arguments, error handling and progress bars.

Command modules import this one and never each other. Nothing here imports torch, matplotlib
or the planner at module import time: `paraplan --help` stays fast.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Union

from ..api import model_profile
from ..planner import limits
from ..planner.config import EpDispatch, Runtime
from ..planner.frameworks import RUNTIMES, Framework, module_choices
from ..planner.limits import MAX_SECONDS, Bound

if TYPE_CHECKING:
    from tqdm import tqdm

    from ..planner.cluster import Cluster
    from ..planner.model import ModelProfile

EXIT_OK = 0
"""The command did what was asked."""
EXIT_FAILED = 1
"""The input was good but the work failed (a calibration rank crashed twice): one line on
stderr names the failure."""
EXIT_BAD_INPUT = 2
"""Bad input, or nothing fits (the message on stderr says why and what to change); argparse
uses the same status for arguments it rejects."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT, as shells report it)."""

Handler = Callable[[argparse.Namespace], int]
"""A command: parsed arguments in, exit status out."""

_COUNT_SUFFIXES = {"k": 2**10, "m": 2**20, "g": 2**30}
"""Count suffixes are binary, as token budgets are quoted: 16M tokens = 16 * 2**20."""
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}
"""Memory size suffixes: KiB/MiB/GiB/TiB and bare K/M/G/T are binary (as PyTorch and nvidia-smi
report memory); KB/MB/GB/TB are decimal (SI)."""
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


# ---- argument types ---------------------------------------------------------------------------
def parse_count(text: str) -> int:
    """An integer with an optional K/M/G suffix (e.g. 16M), exact for plain integers of any
    size; a non-finite, fractional or non-positive count is an argparse error."""
    raw = text.strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if raw and raw[-1] in _COUNT_SUFFIXES:
        scale, raw = _COUNT_SUFFIXES[raw[-1]], raw[:-1]
    try:
        return _positive(text, int(raw) * scale)
    except ValueError:
        pass  # not a plain integer: 1e6, 1.5K
    try:
        value = float(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count; use an integer such as 256, 16M or 4096K"
        ) from None
    if not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return _positive(text, int(value))


def _positive(text: str, value: int) -> int:
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return value


def count_arg(bound: Bound, parse: Callable[[str], int] = parse_count) -> Callable[[str], int]:
    """An argparse type: a count read by `parse` (default `parse_count`), then held to `bound`
    (planner.limits) so that a huge number is refused before any work, naming the limit."""

    def read(text: str) -> int:
        value = parse(text)
        problem = bound.violation(value)
        if problem:
            raise argparse.ArgumentTypeError(f"{text!r} {problem}")
        return value

    read.__name__ = parse.__name__  # argparse names the type in some messages
    return read


def parse_positive_int(text: str) -> int:
    """A whole number >= 1 (no suffixes)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1, e.g. 1")
    return value


def parse_non_negative_int(text: str) -> int:
    """A whole number >= 0 (no suffixes), e.g. a count of runners-up."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0, e.g. 3")
    return value


def parse_seconds(text: str) -> float:
    """A finite number of seconds > 0, at most a week (`planner.limits.MAX_SECONDS`)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0, e.g. 10")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is above the limit of {MAX_SECONDS:,.0f} seconds (a week); give less"
        )
    return value


def parse_output_path(text: str) -> str:
    """An output path: not empty (`-o ""` would write nothing and report success). Whether it
    can be written is checked before the work (`check_output`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a path; give a name, e.g. -o out.json (or leave -o out where "
            "it is optional)"
        )
    return text


def check_output(args: argparse.Namespace) -> None:
    """Refuse an `-o` path that could not be written, before the search or trace (a folder, a
    device, a missing or read-only folder, a name too long), instead of after it."""
    from ..planner.outputs import check_writable

    if getattr(args, "output", None) is not None:
        check_writable(args.output)


def parse_bytes(text: str) -> float:
    """A memory size such as ``2GiB``, ``1500MB``, ``3.5G`` or ``1e9`` (bytes), > 0. Raises
    argparse.ArgumentTypeError (a ValueError) naming the bad value and the accepted forms."""
    match = _SIZE.match(text.lower().replace("_", ""))
    if not match or match.group(2) not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size; use a number with an optional unit, e.g. 2GiB, "
            "1500MB or 3.5G (K/M/G/T and KiB/MiB/GiB/TiB are binary, KB/MB/GB/TB decimal)"
        )
    value = float(match.group(1)) * _BYTE_UNITS[match.group(2)]
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a memory size > 0, e.g. 2GiB")
    return value


def format_bytes(size_bytes: float, *, round_up: bool = False) -> str:
    """``1.70 GiB``, ``312.5 MiB``: binary units, the precision shown; `round_up` rounds up at
    that precision (for "at least ..." advice, so the figure printed is enough)."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if size_bytes >= scale:
            value = size_bytes / scale
            if round_up:
                value = math.ceil(value * 10**digits - 1e-9) / 10**digits
            return f"{value:.{digits}f} {unit}"
    return f"{math.ceil(size_bytes) if round_up else size_bytes:.0f} B"


# ---- the model / cluster / training-config inputs of plan and compare ------------------------
def add_runtime_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """`--runtime`: the framework whose runtime prices `what` (`planner.frameworks`)."""
    parser.add_argument(
        "--runtime",
        default=None,  # paraplan's, or with --from-config the trainer's (`runtime_name`)
        choices=[f.value for f in Framework],
        help="price for this framework's runtime (default paraplan, the executor's): "
        "torchtitan (eager), torchtitan-compile, torchtitan-async-tp (compiled, Async TP), "
        "megatron (Megatron-Core with Transformer Engine), nemo (megatron with TP "
        "communication overlap, MoE all-to-alls overlapped, bf16 gradients and fp8 parameter "
        f"gathers, as its recipes set): {what}",
    )
    parser.add_argument(
        "--ep-dispatch",
        default=None,
        choices=[d.value for d in EpDispatch],
        help="how MoE tokens reach their experts: alltoall (every copy, the default; nemo's "
        "default is hierarchical), hierarchical (once per node, DeepEP/HybridEP)",
    )


def runtime_name(args: argparse.Namespace) -> str:
    """`--runtime`, or "paraplan" (the executor's) when not given."""
    return str(getattr(args, "runtime", None) or "paraplan")


def add_recompute_modules_arg(parser: argparse.ArgumentParser) -> None:
    """`--recompute-modules`: what Megatron's selective recompute redoes (`chosen_runtime`), and
    `--mtp-layers`: the multi-token-prediction modules trained (`frameworks.mtp_layers`)."""
    parser.add_argument(
        "--recompute-modules",
        default=None,
        metavar="M,M",
        help="with --runtime megatron or nemo: what selective recompute redoes in each block, "
        "Megatron-Core's --recompute-modules (core_attn, layernorm, moe_act, moe, ...; default "
        "core_attn); plan takes auto: the fastest of core_attn, layernorm,moe_act, layernorm,moe",
    )
    parser.add_argument(
        "--mtp-layers",
        type=int,
        default=None,
        metavar="N",
        help="multi-token-prediction modules trained after the blocks (DeepSeek-V3's; Megatron's "
        "--mtp-num-layers): default the model's own with --runtime nemo, as its recipes, else 0",
    )


def chosen_runtime(args: argparse.Namespace, *, allow_auto: bool = False) -> Runtime:
    """The runtime `--runtime` names, with `--recompute-modules` where given (ValueError for a
    bad list, before any tracing); with `allow_auto` (`plan`), `auto` checks the runtime takes
    a list and leaves the choice to the search (the runtime is returned as it is)."""
    framework = Framework(runtime_name(args))
    text = getattr(args, "recompute_modules", None)
    choices = module_choices(text, framework, allow_auto=allow_auto)
    runtime = RUNTIMES[framework]
    if getattr(args, "ep_dispatch", None):
        runtime = replace(runtime, ep_dispatch=EpDispatch(args.ep_dispatch))
    return replace(runtime, recompute_modules=choices[0]) if len(choices) == 1 else runtime


def add_input_args(
    parser: argparse.ArgumentParser, verb: str, *, batch_required: bool = True
) -> None:
    """The model, cluster and training-config arguments `plan` and `compare` share
    (`batch_required=False`: the command checks for a batch itself, as `plan --from-config`)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        metavar="M",
        help="a preset (gpt2, gpt2-xl, gpt3-175b, llama3-8b, llama3-70b, llama3-405b, "
        "mixtral-8x7b, gpt-oss-20b, gpt-oss-120b, deepseek-v3), a Hugging Face config.json, "
        "'gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048', or a .json spec file",
    )
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
    parser.add_argument(
        "--gpus", type=count_arg(limits.GPUS), metavar="N", help="GPU count (with --gpu)"
    )
    parser.add_argument("--gpu", metavar="NAME", help="accelerator name (with --gpus)")
    parser.add_argument(
        "--gpus-per-node",
        type=count_arg(limits.GPUS_PER_NODE),
        metavar="G",
        help="GPUs per node (default 8)",
    )
    batch = parser.add_mutually_exclusive_group(required=batch_required)
    batch.add_argument(
        "--global-batch",
        type=count_arg(limits.GLOBAL_BATCH),
        metavar="N",
        help="sequences per optimizer step",
    )
    batch.add_argument(
        "--global-batch-tokens",
        type=count_arg(limits.BATCH_TOKENS),
        metavar="T",
        help="tokens per optimizer step (e.g. 16M); must be a multiple of --seq-len",
    )
    parser.add_argument(
        "--seq-len",
        type=count_arg(limits.SEQ_LEN),
        metavar="S",
        help="tokens per sequence (default: the model's context length)",
    )
    parser.add_argument(
        "--precision",
        default="bf16",
        choices=["bf16", "fp16", "fp32", "fp8"],
        help="training precision (default bf16 mixed precision; fp8: bf16 with the blocks' "
        "linear layers in fp8, as torchtitan's Float8 and Transformer Engine run them)",
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


def add_no_progress_arg(parser: argparse.ArgumentParser) -> None:
    """`--no-progress`: no progress bar on stderr (there is none off a terminal anyway)."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def read_cluster(args: argparse.Namespace) -> Cluster:
    """The cluster `--cluster` or `--gpus/--gpu` describe."""
    from ..planner.cluster import make_cluster, parse_cluster

    if args.cluster and (args.gpus or args.gpu):
        raise ValueError("give either --cluster or --gpus with --gpu, not both")
    if args.cluster:
        cluster = parse_cluster(args.cluster, gpus_per_node=args.gpus_per_node)
    elif args.gpus and args.gpu:
        cluster = make_cluster(args.gpu, args.gpus, gpus_per_node=args.gpus_per_node)
    else:
        raise ValueError("no cluster: give --cluster 8xh100 (or a file), or --gpus N --gpu NAME")
    limits.check_cluster(cluster)  # a cluster is only numbers: nothing was done yet
    return cluster


def read_model(args: argparse.Namespace, notes: list[str]) -> tuple[ModelProfile, int]:
    """The model profile (`--profile`, or `--model` traced or analytic) and the global batch in
    sequences (`--global-batch`, or `--global-batch-tokens` over the sequence length). Notes
    (e.g. tracing fell back to the analytic spec) are appended to `notes` and printed."""
    from ..planner.profile_io import load_profile

    if args.profile:
        profile = load_profile(args.profile)
        if args.seq_len and args.seq_len != profile.seq_len:
            raise ValueError(
                f"--seq-len {args.seq_len} differs from the profile's {profile.seq_len}; "
                "profile the model at the training sequence length"
            )
    else:
        from ..planner.hf_presets import is_hf_model

        found: list[str] = []
        traced = args.model_source != "spec" and is_hf_model(args.model)
        with progress_bar(args, desc="model", total=1, unit="step", enabled=traced) as bar:
            bar.set_postfix_str(f"reading {args.model} (tracing imports torch first)")
            profile = model_profile(
                args.model,
                seq_len=args.seq_len,
                precision=args.precision,
                source=args.model_source,
                progress=show_progress(args),  # the profiler's own bar, below this one
                notes=found,
            )
            bar.update(1)
        print_notes(found)
        notes += found
    seq = profile.seq_len
    tokens = args.global_batch_tokens
    if not tokens:
        return profile, args.global_batch
    if tokens % seq:
        raise ValueError(
            f"--global-batch-tokens {tokens} is not a multiple of the sequence length {seq}; "
            f"use a multiple such as {seq * max(1, tokens // seq)}"
        )
    limits.GLOBAL_BATCH.check(tokens // seq, f"--global-batch-tokens {tokens} / seq_len {seq}")
    return profile, tokens // seq


def print_notes(notes: list[str]) -> None:
    """Notes for the user (not errors) on stderr."""
    for note in notes:
        print(f"paraplan: note: {note}", file=sys.stderr)


# ---- progress and errors -----------------------------------------------------------------------
def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress: only on a terminal, and not under `--no-progress`."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


class QuietBar:
    """What a command calls on its progress bar when none is drawn: nothing happens, and tqdm
    (50 ms of imports) is not loaded."""

    disable = True

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0

    def update(self, n: float = 1) -> None:
        """Nothing to draw."""

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Nothing to draw."""

    def close(self) -> None:
        """Nothing to erase."""


Bar = Union["tqdm[Any]", QuietBar]
"""A drawn tqdm bar or the quiet stand-in (`progress_bar`)."""


@contextmanager
def progress_bar(
    args: argparse.Namespace, *, desc: str, total: int, unit: str, enabled: bool = True
) -> Iterator[Bar]:
    """A tqdm bar on stderr, drawn when `show_progress(args)` and `enabled`, erased when done;
    else a `QuietBar`."""
    if not (enabled and show_progress(args)):
        yield QuietBar(total)
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, leave=False) as bar:
        yield bar


def fraction_callback(bar: Bar) -> Callable[[float], None] | None:
    """A `progress(fraction_done)` callback that moves `bar` (None when the bar is off)."""
    if bar.disable or not bar.total:
        return None
    total = bar.total

    def update(fraction: float) -> None:
        bar.update(max(0, round(total * min(1.0, fraction)) - bar.n))

    return update


def closing_callback(bar: Bar) -> Callable[[float], None] | None:
    """`fraction_callback`, closing (erasing) the bar when the work is done: for a command
    that prints its result before the bar's `with` block ends."""
    update = fraction_callback(bar)
    if update is None:
        return None

    def follow(fraction: float) -> None:
        update(fraction)
        if fraction >= 1.0:
            bar.close()

    return follow


def run_command(handler: Handler, args: argparse.Namespace) -> int:
    """Run a command; bad input (ValueError) and file errors (OSError) become one line on
    stderr and exit status 2, never a traceback."""
    try:
        return handler(args)
    except BrokenPipeError:  # e.g. `paraplan plan ... | head`
        return EXIT_OK
    except KeyboardInterrupt:
        print("paraplan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OSError) as exc:
        print(f"paraplan: error: {_message(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _message(exc: Exception) -> str:
    """The error as one line: a file error names the file and what went wrong."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)
