"""The types every trainer mapping shares: the trainer, what a trainer configuration says
(`TrainerSetup`), and what a trainer cannot express (`Gap`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ..planner.config import Precision
from ..planner.pins import Pins
from ..planner.plan import Plan
from ..planner.strategy import Recompute, Schedule, Strategy


class Target(StrEnum):
    """A trainer paraplan writes configurations for and reads them from."""

    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Gap:
    """A plan feature a trainer cannot express as planned."""

    feature: str
    """The feature in words, with the plan's value (e.g. ``ZeRO-1 (zero_stage=1)``)."""
    nearest: str
    """What the trainer gets instead ('' when it has nothing near: then export refuses)."""

    @property
    def refused(self) -> bool:
        """Whether the trainer has nothing near (the export stops, naming the feature)."""
        return not self.nearest


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerSetup:
    """What a trainer configuration says, in the planner's terms."""

    target: Target
    """The trainer the configuration is for."""
    strategy: Strategy
    """Degrees, sharding, schedule, micro-batch and recompute, as the search names them."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int | None
    """Tokens per sequence (None when the configuration does not say: DeepSpeed's)."""
    precision: Precision
    """Training precision (bf16/fp16 are mixed precision with fp32 master weights)."""
    notes: tuple[str, ...] = ()
    """What was read approximately or left out, in words (printed beside the comparison)."""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation included)."""
        return self.global_batch // (self.strategy.dp * self.strategy.micro_batch_size)

    def pins(self) -> Pins:
        """Every dimension pinned, as `--fix` would (the search picks only the mesh order)."""
        return Pins.of(self.strategy)


def plan_strategy(plan: Plan) -> Strategy:
    """The plan's strategy, HSDP shard group included."""
    s = plan.strategy()
    shard = plan.parallelism.dp_shard
    return s if shard == s.dp else replace(s, dp_shard=shard)


def uniform_recompute(plan: Plan) -> Recompute:
    """The one policy for every block nearest to a per-layer plan and at least as frugal with
    memory: full if any block is fully recomputed, else selective if any is, else none."""
    blocks = {d.recompute for d in plan.layers if d.name.startswith("block")}
    for policy in (Recompute.FULL, Recompute.SELECTIVE):
        if policy in blocks:
            return policy
    return Recompute.NONE


def check_batch(setup: TrainerSetup) -> TrainerSetup:
    """`setup` if its batch splits evenly over dp x micro-batch; else ValueError naming the
    numbers."""
    s = setup.strategy
    per_step = s.dp * s.micro_batch_size
    if setup.global_batch % per_step:
        raise ValueError(
            f"{setup.target} config: global batch {setup.global_batch} is not a multiple of "
            f"data-parallel degree {s.dp} x micro-batch {s.micro_batch_size} = {per_step}; "
            "fix the batch sizes in the config"
        )
    if s.pp > 1 and s.schedule == Schedule.NONE:
        raise ValueError(f"{setup.target} config: pp={s.pp} needs a pipeline schedule")
    return setup
