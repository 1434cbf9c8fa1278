"""`export_plan`: a plan as a trainer's configuration, with what the trainer cannot express
mapped to its nearest and priced by the cost model, or refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..api import model_profile
from ..planner.cluster import Cluster, parse_cluster
from ..planner.config import TrainConfig
from ..planner.cost.estimate import Estimate
from ..planner.cost.evaluate import Evaluator
from ..planner.model import ModelProfile
from ..planner.mtp import with_mtp
from ..planner.plan import Plan
from ..planner.profile_io import load_profile
from ..planner.strategy import Strategy
from . import deepspeed, megatron, torchtitan
from .setup import Gap, Target, plan_strategy

Nearest = Callable[[Plan, Strategy], tuple[Strategy, list[Gap]]]
"""A trainer's mapping: the nearest strategy it can express, and the gaps."""
Render = Callable[[Plan, Strategy], str]
"""A trainer's writer: the configuration text of an expressible strategy."""
TARGETS: dict[Target, tuple[Nearest, Render]] = {
    Target.TORCHTITAN: (torchtitan.nearest, torchtitan.render),
    Target.MEGATRON: (megatron.nearest, megatron.render),
    Target.DEEPSPEED: (deepspeed.nearest, deepspeed.render),
}
"""Each trainer's mapping and writer."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Approximation:
    """What the trainer runs instead of the plan, and what the cost model predicts for it."""

    gaps: tuple[Gap, ...]
    """The features mapped to their nearest."""
    strategy: Strategy
    """The strategy the exported configuration describes."""
    planned_step_s: float
    """The plan's predicted seconds per step."""
    exported_step_s: float
    """Predicted seconds per step of what the configuration describes."""
    exported_memory_bytes: float
    """Its predicted peak memory per GPU."""

    def describe(self) -> list[str]:
        """The warning lines: each gap, then the predicted cost of the difference."""
        lines = [f"{g.feature} -> {g.nearest}" for g in self.gaps]
        delta = self.exported_step_s - self.planned_step_s
        lines.append(
            f"predicted cost: {self.exported_step_s:.3f} s per step instead of "
            f"{self.planned_step_s:.3f} s ({delta:+.3f} s, {delta / self.planned_step_s:+.1%}), "
            f"{self.exported_memory_bytes / 2**30:.1f} GiB per GPU"
        )
        return lines


@dataclass(frozen=True, kw_only=True, slots=True)
class Exported:
    """A plan written for a trainer."""

    target: Target
    """The trainer."""
    text: str
    """The configuration file's text."""
    approximation: Approximation | None
    """What differs from the plan (None: the trainer expresses the plan as it is)."""


class Costing:
    """Prices strategies for the model, cluster and training configuration of a plan."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, plan: Plan) -> None:
        if profile.mtp_blocks != plan.train.mtp_layers:  # the modules the plan trains
            profile = with_mtp(profile, plan.train.mtp_layers)
        if profile.fingerprint() != plan.model.fingerprint:
            raise ValueError(
                f"the model profile ({profile.name}, fingerprint {profile.fingerprint()}) is not "
                f"the one the plan was made from ({plan.model.fingerprint}); give the --model or "
                "--profile the plan was made from"
            )
        t = plan.train
        train = TrainConfig(
            global_batch=t.global_batch,
            seq_len=t.seq_len,
            precision=t.precision,
            optimizer=t.optimizer,
            memory_headroom=t.memory_headroom,
            runtime=t.runtime,  # priced as the plan was
            mtp_layers=t.mtp_layers,
        )
        self.evaluator = Evaluator(profile, cluster, train)

    def estimate(self, s: Strategy) -> Estimate:
        """The cost model's prediction for `s` (ValueError when `s` breaks a rule)."""
        return self.evaluator.evaluate(s)


def export_plan(
    plan: Plan, target: Target, costing: Costing | Callable[[], Costing] | None
) -> Exported:
    """`plan` as `target`'s configuration. A feature the trainer lacks is mapped to its
    nearest and priced with `costing` (or the `Costing` it makes, called only then);
    ValueError when the trainer has nothing near (naming the feature), when the nearest does
    not fit, or when it needs pricing and no `costing` is given."""
    nearest, render = TARGETS[target]
    chosen = plan_strategy(plan)
    strategy, gaps = nearest(plan, chosen)
    refused = [g.feature for g in gaps if g.refused]
    if refused:
        raise ValueError(
            f"{target} cannot express {'; '.join(refused)}; re-plan without it, e.g. with "
            f"--fix, or export to another trainer"
        )
    if not gaps:
        return Exported(target=target, text=render(plan, strategy), approximation=None)
    what = "; ".join(f"{g.feature} -> {g.nearest}" for g in gaps)
    if costing is None:
        raise ValueError(
            f"{target} cannot express the plan exactly ({what}); pricing the nearest needs the "
            "plan's model: give --model or --profile"
        )
    pricing = costing if isinstance(costing, Costing) else costing()
    try:
        est = pricing.estimate(strategy)
    except ValueError as exc:
        raise ValueError(
            f"{target}: the nearest configuration ({what}) is not valid: {exc}"
        ) from None
    if not est.feasible:
        raise ValueError(
            f"{target} cannot express {what}: the nearest configuration does not fit "
            f"({est.reason}); "
            "re-plan with --fix for what the trainer has"
        )
    approximation = Approximation(
        gaps=tuple(gaps),
        strategy=strategy,
        planned_step_s=plan.predicted.step_time_s,
        exported_step_s=est.step_time_s,
        exported_memory_bytes=est.memory.total_bytes,
    )
    return Exported(target=target, text=render(plan, strategy), approximation=approximation)


def costing_for(
    plan: Plan,
    *,
    model: str | None = None,
    profile_path: str | None = None,
    cluster: str | None = None,
    source: str = "auto",
) -> Costing:
    """The `Costing` of `plan`: its model rebuilt from `model` (default: the plan's model name;
    the analytic spec is tried first, then `source`) or read from `profile_path`, on `cluster`
    (default: the plan's cluster name). ValueError when no rebuilt model matches the plan's
    fingerprint."""

    cl = parse_cluster(cluster or plan.cluster.name)
    if profile_path:
        return Costing(load_profile(profile_path), cl, plan)
    name, seq, precision = model or plan.model.name, plan.train.seq_len, str(plan.train.precision)
    last: ValueError | None = None
    for how in dict.fromkeys(("spec", source)):
        try:
            profile = model_profile(name, seq_len=seq, precision=precision, source=how)
            return Costing(profile, cl, plan)
        except ValueError as exc:
            last = exc
    raise ValueError(f"cannot rebuild the plan's model {name!r}: {last}")
