"""The planner's entry point: model + cluster + training config -> plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from . import replay_store
from .build import PlanContext, build_plan
from .capabilities import precision_gap
from .cluster import Cluster
from .config import Precision, RecomputeModule, TrainConfig
from .cost.count_split import CountSplit
from .cost.evaluate import Estimate, Evaluator
from .cost.float8 import fp8_problem
from .cost.layout import StageSplit
from .cost.recompute_pattern import RecomputePattern
from .framework_pins import framework_pins, mtp_pins, refuse_framework_cluster
from .frameworks import is_own, space_of
from .limits import check_planning
from .model import ModelProfile
from .mtp import with_mtp
from .options import NO_CONSENT, Consent
from .pins import Pins
from .plan import Plan
from .replay import finalists, replayed
from .search import Search, SearchResult
from .units import gib


class NoFeasiblePlanError(ValueError):
    """No strategy fits in memory; carries the least memory any strategy needs."""

    def __init__(self, message: str, least: Estimate | None) -> None:
        super().__init__(message)
        self.least = least


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanOutcome:
    """A plan and the search behind it."""

    plan: Plan
    """The chosen plan (or, with every dimension pinned, the one evaluated)."""
    result: SearchResult
    """Everything the search found."""


HOST_OFFLOAD_KEYS = ("offload_optimizer", "offload_params", "offload_activations")
"""Pins that move state to the host."""


def host_offload_pins(cluster: Cluster, pins: Pins | None) -> Pins | None:
    """On a cluster of CPUs the devices are the host: offload has nowhere to go (it would only
    add copies and, in the executor, FSDP2's CPU-offload wrapping around a single rank), so it
    is pinned off; pinned on, it is refused (ValueError)."""
    if not cluster.accelerator.is_host:
        return pins
    pins = pins or Pins()
    for key in HOST_OFFLOAD_KEYS:
        if getattr(pins, key):
            raise ValueError(
                f"--fix {key}=true on cluster {cluster.name!r}: its devices are the host's "
                f"CPUs, so there is no separate host memory to offload to; drop {key} (or "
                "plan for a GPU cluster)"
            )
    return replace(pins, offload_optimizer=False, offload_params=False, offload_activations=False)


def refuse_precision(cluster: Cluster, precision: Precision, any_engine: bool) -> None:
    """ValueError before any search when no plan in `precision` can come out: fp8 on a
    cluster without fp8 tensor cores, or a precision the executor does not train in when only
    its plans are asked for (every candidate would be dropped)."""
    if precision == Precision.FP8:
        problem = fp8_problem(cluster)
        if problem is not None:
            raise ValueError(problem)
    gap = None if any_engine else precision_gap(precision)
    if gap is not None:
        raise ValueError(
            f"{gap}; or plan for the trainer that will run it (--runtime megatron, nemo, "
            "torchtitan, torchtitan-compile or torchtitan-async-tp; or --any-engine), and "
            "paraplan export writes its config"
        )


def make_plan(
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    *,
    pins: Pins | None = None,
    top_k: int = 3,
    progress: Callable[[float], None] | None = None,
    any_engine: bool = False,
    consent: Consent = NO_CONSENT,
    within_framework: bool = True,
    split: StageSplit | CountSplit = StageSplit.BALANCED,
    pattern: RecomputePattern | None = None,
) -> PlanOutcome:
    """Search the space and build the plan (only strategies the executor runs, unless
    `any_engine` or `train.runtime` is another framework's (`frameworks.py`): then any
    strategy the cost model prices; PowerSGD and the asynchronous
    pipeline only with `consent`, `planner/options.py`). Raises `NoFeasiblePlanError` when
    nothing fits (unless every dimension is pinned: then the plan is returned marked
    infeasible). A search for another framework's runtime keeps to what it runs (`frameworks.
    FrameworkSpace`) unless not `within_framework` (a trainer's own configuration, pinned).
    `split`: how the blocks are split over pipeline chunks (by cost; a trainer configuration's
    own split by count, `cost/count_split.py`); `pattern`: the blocks a trainer configuration
    recomputes, priced for `per_layer` in place of the solver's choice (`recompute_pattern.py`)."""
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0")
    profile = with_mtp(profile, train.mtp_layers)  # the modules trained, in the chain
    if RecomputeModule.MLA_UP_PROJ in train.runtime.recompute_modules and (
        profile.latent_attention is None
    ):
        raise ValueError(
            f"--recompute-modules mla_up_proj: {profile.name} has no multi-head latent "
            "attention to recompute the up projections of (Megatron-Core refuses it too); "
            "leave mla_up_proj out"
        )
    check_planning(profile, cluster, train, pins)  # every count in bounds before any search
    own = is_own(train.runtime)  # priced for paraplan's executor: rank only what it runs
    refuse_precision(cluster, train.precision, any_engine or not own)
    asked = pins
    if within_framework:
        refuse_framework_cluster(cluster, train.runtime)
        pins = framework_pins(pins, train.runtime, consent)
        pins = mtp_pins(pins, train.runtime, train.mtp_layers)
    pins = host_offload_pins(cluster, pins)
    ev = Evaluator(profile, cluster, train, split, pattern)
    space = space_of(train.runtime) if within_framework else None  # what it runs
    search = Search(ev, pins, runnable_only=own and not any_engine, consent=consent, space=space)
    result = search.run(top_k=top_k, progress=progress)
    replay_store.STORE.flush()  # the replays this search computed, for the next run
    ctx = PlanContext(profile=profile, cluster=cluster, train=train, split=split, pattern=pattern)
    if result.best is not None:
        best, *others = finalists(ev, result.ranked)  # the closed form's finalists, replayed
        return PlanOutcome(plan=build_plan(ctx, best, tuple(others)), result=result)
    least = result.min_memory
    if search.all_pinned and least is not None:
        return PlanOutcome(plan=build_plan(ctx, replayed(ev, least), ()), result=result)
    need = gib(least.memory.total_bytes) if least else "unknown"
    cap = gib(ev.capacity_bytes)
    pinned = asked.describe() if asked is not None else ""
    what = f" with --fix {pinned}" if pinned else ""
    hint = (
        f" (least-memory strategy: {least.strategy.short()}, on stage {least.peak_stage})"
        if least
        else ""
    )
    raise NoFeasiblePlanError(
        f"{profile.name} does not fit on {cluster.name}{what}: the smallest per-GPU memory any "
        f"plan needs is {need}{hint}, but each {cluster.accelerator.name} offers {cap} "
        f"usable; use more GPUs, GPUs with more memory, a smaller global batch or sequence, "
        f"or fewer pinned dimensions",
        least,
    )
