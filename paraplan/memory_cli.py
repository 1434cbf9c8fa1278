"""`paraplan checkpoint`: which layers to recompute so one micro-batch's activations fit a
memory budget, at the least extra time.

The model becomes a chain of layers (a profile JSON written by `paraplan profile -o`, or a
Hugging Face preset/config traced on the meta device); the chain is solved by Rotor's dynamic
program (Beaumont et al. 2019, `--solver dp`, the default) or the Checkmate-style ILP (Jain et
al. 2020, `--solver ilp`). Layer times are the profile's measurements when it has them, else
the roofline of `--gpu` (FLOPs at peak times the catalog's matmul efficiency).

Exit status: 0 with a schedule; 2 on bad input or when nothing fits the budget (the message
says the smallest budget that works and what to change).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .planner.model import ModelProfile
    from .planner.solvers import Chain, Op

EXIT_BAD_INPUT = 2
"""Same as `paraplan.cli.EXIT_BAD_INPUT` (defined again here so the two modules can import each
other in either order)."""
DEFAULT_GPU = "h100"
"""Accelerator whose roofline times a profile without measured times."""
SCHEDULE_SCHEMA_VERSION = 1
"""Bumped on any incompatible change of the schedule JSON."""

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}  # fmt: skip
"""Memory size suffixes: KiB/MiB/GiB/TiB and bare K/M/G/T are binary (as PyTorch and nvidia-smi
report memory); KB/MB/GB/TB are decimal (SI)."""
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1, e.g. 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0, e.g. 10")
    return value


def add_parser(subparsers: Any) -> None:
    """Add the `checkpoint` command to a `parser.add_subparsers()` object."""
    cmd = subparsers.add_parser(
        "checkpoint",
        help="choose the layers to recompute so activations fit a memory budget",
        description="Solve activation checkpointing for one micro-batch: which layers keep only "
        "their input and are recomputed before their backward, so the activation peak stays "
        "within --budget at the least extra time (Rotor DP or Checkmate-style ILP).",
    )  # fmt: skip
    cmd.add_argument(
        "--model", required=True, metavar="M",
        help="a profile JSON written by paraplan profile -o, a Hugging Face preset (gpt2, "
        "llama3-8b, ...) or config.json (traced on the meta device), or an analytic spec",
    )  # fmt: skip
    cmd.add_argument(
        "--budget", required=True, type=parse_bytes, metavar="SIZE",
        help="memory for one micro-batch's activations, their gradients and transients (not "
        "weights or optimizer state), e.g. 2GiB, 1500MB, 3.5G",
    )  # fmt: skip
    cmd.add_argument("--seq-len", type=_positive_int, metavar="S",
                     help="tokens per sequence (default: the model's context length; a profile "
                     "JSON has its own)")  # fmt: skip
    cmd.add_argument("--micro-batch", type=_positive_int, default=1, metavar="B",
                     help="sequences per micro-batch (default 1)")  # fmt: skip
    cmd.add_argument("--solver", choices=["dp", "ilp"], default="dp",
                     help="dp (default): Rotor's optimal persistent schedule; ilp: also drops "
                     "and recomputes checkpoints (slower to solve)")  # fmt: skip
    cmd.add_argument("--gpu", metavar="NAME",
                     help="time layers by this accelerator's roofline (default: the profile's "
                     f"measured times, else {DEFAULT_GPU})")  # fmt: skip
    cmd.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                     help="activation precision of a traced model (default bf16)")  # fmt: skip
    cmd.add_argument("--time-limit", type=_positive_float, default=10.0, metavar="S",
                     help="ILP time limit in seconds (default 10)")  # fmt: skip
    cmd.add_argument("-o", "--output", metavar="PATH", help="write the schedule JSON here")


# ---- the schedule file ----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleStep:
    """One operation of the schedule, in execution order."""

    op: str
    """"forward" or "backward"."""
    layer: int
    """Index of the layer in `CheckpointSchedule.layers`."""
    keep_saved: bool
    """Forward: keep what the backward reads (False: keep nothing, recompute later). Always
    True for a backward."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSchedule:
    """A checkpointing schedule for one micro-batch, as `paraplan checkpoint -o` writes it."""

    model: str
    """Model name."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch_size: int
    """Sequences per micro-batch."""
    times: str
    """Where layer times come from, e.g. "measured on cpu" or "h100 roofline"."""
    solver: str
    """"dp" or "ilp"."""
    status: str
    """Solver status: "optimal" or "feasible" (fits, optimality not proven)."""
    budget_bytes: float
    """The memory budget."""
    peak_bytes: float
    """Simulated peak memory of the schedule."""
    min_budget_bytes: float
    """Smallest peak any checkpointing schedule reaches (the DP's exact minimum)."""
    store_all_peak_bytes: float
    """Peak without recomputation."""
    makespan_s: float
    """Simulated time of one forward and backward of the micro-batch, recomputations included."""
    store_all_makespan_s: float
    """The same without recomputation."""
    layers: tuple[str, ...]
    """Layer names, in execution order."""
    recomputed: tuple[int, ...]
    """Per layer, how many times its forward is run again (0: stored)."""
    steps: tuple[ScheduleStep, ...]
    """The operations."""

    @property
    def overhead(self) -> float:
        """Makespan over the store-all makespan, minus 1."""
        ref = self.store_all_makespan_s
        return self.makespan_s / ref - 1 if ref > 0 else 0.0


def schedule_schema() -> dict[str, Any]:
    """The schedule JSON schema (draft 2020-12), strict: no unknown keys."""
    from .planner.jsonio import object_schema

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/checkpoint-schedule.schema.json",
        "title": "paraplan checkpointing schedule",
        "type": "object",
        "properties": {
            "schema_version": {"const": SCHEDULE_SCHEMA_VERSION},
            "schedule": object_schema(CheckpointSchedule, {
                "op": {"enum": ["forward", "backward"]},
                "solver": {"enum": ["dp", "ilp"]},
                "status": {"enum": ["optimal", "feasible"]},
                "layer": {"type": "integer", "minimum": 0},
            }),
        },
        "required": ["schema_version", "schedule"],
        "additionalProperties": False,
    }  # fmt: skip


def save_schedule(schedule: CheckpointSchedule, path: str | os.PathLike[str]) -> None:
    """Write atomically."""
    from .planner.jsonio import to_json, write_atomic

    doc = {"schema_version": SCHEDULE_SCHEMA_VERSION, "schedule": to_json(schedule)}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def load_schedule(path: str | os.PathLike[str]) -> CheckpointSchedule:
    """Read and strictly validate a schedule JSON file (ValueError naming the problem)."""
    from .planner.jsonio import from_json, read_json, validate

    data = read_json(path, "schedule", "write one with paraplan checkpoint -o")
    try:
        validate(data, schedule_schema(), "schedule")
    except ValueError as exc:
        raise ValueError(f"schedule file {str(path)!r}: {exc}") from None
    return from_json(CheckpointSchedule, data["schedule"])  # type: ignore[no-any-return]


# ---- the command ----------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run `paraplan checkpoint` on parsed arguments; prints, returns the exit status."""
    try:
        return _run(args)
    except ValueError as exc:
        print(f"paraplan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _profile(args: argparse.Namespace) -> ModelProfile:
    """The model's profile: a profile JSON as written, or a traced/analytic model."""
    from .api import model_profile
    from .planner.hf_presets import is_hf_model
    from .planner.profile_io import load_profile

    path = Path(args.model)
    if path.suffix == ".json" and path.is_file() and not is_hf_model(args.model):
        profile = load_profile(path)
        if args.seq_len and args.seq_len != profile.seq_len:
            raise ValueError(
                f"--seq-len {args.seq_len} differs from the profile's {profile.seq_len}; "
                "profile the model again at that sequence length (paraplan profile --seq-len)"
            )
        return profile
    notes: list[str] = []
    profile = model_profile(args.model, seq_len=args.seq_len, precision=args.precision,
                            source="auto", notes=notes)  # fmt: skip
    for note in notes:
        print(f"paraplan: note: {note}", file=sys.stderr)
    return profile


def _chain(profile: ModelProfile, args: argparse.Namespace) -> tuple[Chain, str]:
    """The solver chain and where its times come from."""
    from .planner.hardware import get_accelerator
    from .planner.solvers.tradeoff import profiled_chain

    measured = all(x.fwd_time_s is not None and x.bwd_time_s is not None for x in profile.layers)
    if args.gpu is None and measured:
        times = f"measured on {profile.measured_on or 'the profiling device'}"
        spf = None
    else:
        acc = get_accelerator(args.gpu or DEFAULT_GPU)
        dtype = "fp32" if profile.act_dtype_bytes >= 4 else "bf16"
        spf = 1 / (acc.peak_flops_for(dtype) * acc.matmul_efficiency)
        times = f"{acc.name} roofline ({dtype}, {acc.matmul_efficiency:.0%} of peak)"
    chain = profiled_chain(profile, micro_batch_size=args.micro_batch, seconds_per_flop=spf,
                           name=profile.name)  # fmt: skip
    return chain, times


def _describe(profile: ModelProfile, micro_batch: int) -> str:
    return f"{profile.name} (micro-batch {micro_batch}, seq {profile.seq_len})"


def _run(args: argparse.Namespace) -> int:
    from .planner.solvers import SolveStatus, simulate, solve_checkpoint_dp, solve_remat_ilp
    from .planner.solvers.tradeoff import baseline_schedule

    profile = _profile(args)
    chain, times = _chain(profile, args)
    what = _describe(profile, args.micro_batch)
    budget = float(args.budget)
    dp = solve_checkpoint_dp(chain, budget)
    sol = dp if args.solver == "dp" else solve_remat_ilp(chain, budget,
                                                         time_limit_s=args.time_limit)  # fmt: skip
    if sol.status == SolveStatus.TIME_LIMIT:
        raise ValueError(
            f"the ILP found no schedule for {what} within {format_bytes(budget)} in "
            f"{args.time_limit:g} s and proved nothing; raise --time-limit or use --solver dp"
        )
    if sol.status == SolveStatus.INFEASIBLE or not sol.ops:
        least = sol.min_budget_bytes if sol.min_budget_bytes is not None else dp.min_budget_bytes
        lower = ("lower --micro-batch" if args.micro_batch > 1 else
                 "use a shorter sequence (--seq-len) or shard activations with tensor, sequence "
                 "or context parallelism (paraplan plan)")  # fmt: skip
        print(
            f"paraplan: error: budget {format_bytes(budget)} is below the smallest feasible "
            f"peak {format_bytes(least, round_up=True)} for {what}: raise --budget to at least "
            f"{format_bytes(least, round_up=True)} or {lower}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    replay = simulate(chain, sol.ops)
    store = simulate(chain, baseline_schedule(chain, "store-all"))
    schedule = CheckpointSchedule(
        model=profile.name, seq_len=profile.seq_len, micro_batch_size=args.micro_batch,
        times=times, solver=args.solver, status=SolveStatus(sol.status).value,
        budget_bytes=budget, peak_bytes=replay.peak_bytes, min_budget_bytes=dp.min_budget_bytes,
        store_all_peak_bytes=store.peak_bytes, makespan_s=replay.makespan_s,
        store_all_makespan_s=store.makespan_s,
        layers=tuple(layer.name for layer in chain.layers),
        recomputed=_recomputations(sol.ops, len(chain)), steps=_steps(sol.ops),
    )  # fmt: skip
    print(format_schedule_summary(schedule))
    if args.output:
        save_schedule(schedule, args.output)
        print(f"\nschedule written to {args.output}")
    return 0


def _recomputations(ops: tuple[Op, ...], num_layers: int) -> tuple[int, ...]:
    """Per layer, forwards beyond the first (graph node l is layer l-1)."""
    from .planner.solvers import Forward

    runs = [0] * num_layers
    for op in ops:
        if isinstance(op, Forward):
            runs[op.node - 1] += 1
    return tuple(max(0, r - 1) for r in runs)


def _steps(ops: tuple[Op, ...]) -> tuple[ScheduleStep, ...]:
    from .planner.solvers import Backward, Forward

    steps = []
    for op in ops:
        if isinstance(op, Forward):
            steps.append(ScheduleStep(op="forward", layer=op.node - 1, keep_saved=op.keep_saved))
        elif isinstance(op, Backward):
            steps.append(ScheduleStep(op="backward", layer=op.node - 1, keep_saved=True))
        else:  # the command solves without offload, so no transfers appear
            raise ValueError(f"schedule operation {op!r} cannot be written to a schedule file")
    return tuple(steps)


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
    recomputed = [i for i, n in enumerate(s.recomputed) if n > 0]
    stored = [i for i, n in enumerate(s.recomputed) if n == 0]
    proven = "optimal" if s.status == "optimal" else "feasible, optimality not proven"
    lines = [
        f"{s.model}: micro-batch {s.micro_batch_size}, seq {s.seq_len}, {len(s.layers)} layers; "
        f"times {s.times}",
        f"solver {s.solver}: {proven}",
        f"peak   {format_bytes(s.peak_bytes)} of the {format_bytes(s.budget_bytes)} budget "
        f"(store-all {format_bytes(s.store_all_peak_bytes)}, smallest feasible "
        f"{format_bytes(s.min_budget_bytes)})",
        f"time   {s.makespan_s * 1e3:.2f} ms per micro-batch forward+backward, "
        f"{s.overhead:+.1%} over store-all ({s.store_all_makespan_s * 1e3:.2f} ms)",
    ]
    if recomputed:
        lines.append(f"recompute ({len(recomputed)} layers, input kept, forward run again "
                     f"before the backward): {_ranges(s.layers, recomputed)}")  # fmt: skip
        again = [i for i in recomputed if s.recomputed[i] > 1]
        if again:
            lines.append("  recomputed more than once: " + ", ".join(
                f"{s.layers[i]} x{s.recomputed[i]}" for i in again))  # fmt: skip
        lines.append(f"store all ({len(stored)} layers): {_ranges(s.layers, stored) or '-'}")
    else:
        lines.append("everything fits: no layer is recomputed")
    return "\n".join(lines)
