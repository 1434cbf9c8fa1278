"""The checkpointing (rematerialization) schedule file: which layers of one micro-batch are
recomputed, as `paraplan checkpoint -o` writes it and as tools read it back.

A schedule is the solver's operations (`planner.solvers.schedule`: forwards that keep or drop
what the backward reads, and backwards) turned into a typed, versioned record with the figures
that justify it (budget, simulated peak and time, the store-all reference). The format is strict:
load rejects unknown keys, non-finite numbers and values that contradict each other (a step on
a layer that does not exist, a peak above the budget), naming the field.

Named "remat" so as not to be confused with the pipeline `Schedule` of `planner.strategy`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .documents import Document, wrong_kind
from .jsonio import from_json, object_schema, read_json, to_json, validate, write_atomic
from .solvers.schedule import Backward, Forward, Op, SolveStatus

SCHEDULE_SCHEMA_VERSION = 1
"""Bumped on any incompatible change of the schedule JSON."""
_PEAK_TOLERANCE = 1e-9
"""Relative slack when checking that the peak is within the budget (float round-off)."""


class StepOp(StrEnum):
    """What a schedule step runs."""

    FORWARD = "forward"
    """The layer's forward."""
    BACKWARD = "backward"
    """The layer's backward."""


class RematSolver(StrEnum):
    """The solver that chose a schedule."""

    DP = "dp"
    """Rotor's dynamic program (Beaumont et al. 2019): optimal persistent schedule on a chain."""
    ILP = "ilp"
    """The Checkmate-style ILP (Jain et al. 2020): may also drop and recompute checkpoints."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleStep:
    """One operation of the schedule, in execution order."""

    op: StepOp
    """Forward or backward."""
    layer: int = field(metadata={"minimum": 0})
    """Index of the layer in `CheckpointSchedule.layers`."""
    keep_saved: bool
    """Forward: keep what the backward reads (False: keep nothing, recompute later). Always
    True for a backward."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSchedule:
    """A checkpointing schedule for one micro-batch, as `paraplan checkpoint -o` writes it."""

    model: str
    """Model name."""
    seq_len: int = field(metadata={"minimum": 1})
    """Tokens per sequence."""
    micro_batch_size: int = field(metadata={"minimum": 1})
    """Sequences per micro-batch."""
    times: str
    """Where layer times come from, e.g. "measured on cpu" or "h100 roofline"."""
    solver: RematSolver
    """The solver that chose the schedule."""
    status: SolveStatus
    """Solver status: optimal, or feasible (fits, optimality not proven)."""
    budget_bytes: float = field(metadata={"minimum": 0})
    """The memory budget."""
    peak_bytes: float = field(metadata={"minimum": 0})
    """Simulated peak memory of the schedule."""
    min_budget_bytes: float = field(metadata={"minimum": 0})
    """Smallest peak any checkpointing schedule reaches (the DP's exact minimum)."""
    store_all_peak_bytes: float = field(metadata={"minimum": 0})
    """Peak without recomputation."""
    makespan_s: float = field(metadata={"minimum": 0})
    """Simulated time of one forward and backward of the micro-batch, recomputations included."""
    store_all_makespan_s: float = field(metadata={"minimum": 0})
    """The same without recomputation."""
    layers: tuple[str, ...]
    """Layer names, in execution order."""
    recomputed: tuple[int, ...]
    """Per layer, how many times its forward is run again (0: stored)."""
    steps: tuple[ScheduleStep, ...]
    """The operations."""

    def __post_init__(self) -> None:
        problem = _inconsistency(self)
        if problem:
            raise ValueError(f"checkpoint schedule: {problem}")

    @property
    def overhead(self) -> float:
        """Makespan over the store-all makespan, minus 1."""
        ref = self.store_all_makespan_s
        return self.makespan_s / ref - 1 if ref > 0 else 0.0


def _inconsistency(s: CheckpointSchedule) -> str:
    """What makes the schedule contradict itself ('' when nothing does)."""
    for name in ("seq_len", "micro_batch_size"):
        if getattr(s, name) < 1:
            return f"{name} = {getattr(s, name)} must be >= 1"
    for name in (
        "budget_bytes",
        "peak_bytes",
        "min_budget_bytes",
        "store_all_peak_bytes",
        "makespan_s",
        "store_all_makespan_s",
    ):
        value = getattr(s, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name} = {value!r} must be a finite number >= 0"
    if s.status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        return f"status {s.status.value!r} must be optimal or feasible (a schedule that fits)"
    if s.peak_bytes > s.budget_bytes * (1 + _PEAK_TOLERANCE):
        return f"peak_bytes {s.peak_bytes:.0f} exceeds budget_bytes {s.budget_bytes:.0f}"
    if len(s.recomputed) != len(s.layers):
        return (
            f"recomputed has {len(s.recomputed)} entries for {len(s.layers)} layers; give one "
            "count per layer"
        )
    if any(n < 0 for n in s.recomputed):
        return f"recomputed {list(s.recomputed)} must hold counts >= 0"
    for i, step in enumerate(s.steps):
        if not 0 <= step.layer < len(s.layers):
            return f"steps.{i}.layer = {step.layer} is not a layer index (0..{len(s.layers) - 1})"
    return ""


def schedule_steps(ops: Sequence[Op]) -> tuple[ScheduleStep, ...]:
    """A solver's chain operations as schedule steps (graph node l is layer l-1). Transfers
    (offload, prefetch, wait) have no place in the file and raise ValueError."""
    steps = []
    for op in ops:
        if isinstance(op, Forward):
            steps.append(
                ScheduleStep(op=StepOp.FORWARD, layer=op.node - 1, keep_saved=op.keep_saved)
            )
        elif isinstance(op, Backward):
            steps.append(ScheduleStep(op=StepOp.BACKWARD, layer=op.node - 1, keep_saved=True))
        else:
            raise ValueError(
                f"schedule operation {op!r} cannot be written to a schedule file (it holds "
                "forwards and backwards only); solve without offload"
            )
    return tuple(steps)


def recomputations(ops: Sequence[Op], num_layers: int) -> tuple[int, ...]:
    """Per layer, the forwards run beyond the first (graph node l is layer l-1)."""
    runs = [0] * num_layers
    for op in ops:
        if isinstance(op, Forward):
            runs[op.node - 1] += 1
    return tuple(max(0, r - 1) for r in runs)


def schedule_schema() -> dict[str, Any]:
    """The schedule JSON schema (draft 2020-12), strict: no unknown keys."""
    fitting = [SolveStatus.OPTIMAL.value, SolveStatus.FEASIBLE.value]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/checkpoint-schedule.schema.json",
        "title": "paraplan checkpointing schedule",
        "type": "object",
        "properties": {
            "schema_version": {"const": SCHEDULE_SCHEMA_VERSION},
            "schedule": object_schema(CheckpointSchedule, {"status": {"enum": fitting}}),
        },
        "required": ["schema_version", "schedule"],
        "additionalProperties": False,
    }


def save_schedule(schedule: CheckpointSchedule, path: str | os.PathLike[str]) -> None:
    """Write the schedule JSON atomically."""
    doc = {"schema_version": SCHEDULE_SCHEMA_VERSION, "schedule": to_json(schedule)}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def load_schedule(path: str | os.PathLike[str]) -> CheckpointSchedule:
    """Read and strictly validate a schedule JSON file (ValueError naming the file and the
    problem)."""
    data = read_json(path, "schedule", "write one with paraplan checkpoint -o")
    try:
        other = wrong_kind(data, Document.SCHEDULE, str(path))
        if other is not None:
            raise ValueError(other)
        validate(data, schedule_schema(), "schedule")
        return from_json(CheckpointSchedule, data["schedule"])  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ValueError(f"schedule file {str(path)!r}: {exc}") from None
