"""Named alternatives to the plan, each planned by the ordinary search with some dimensions
pinned (the rest searched), for `paraplan compare`.

- ``plan``: the search's choice, nothing pinned.
- ``fsdp``: pure FSDP (Zhao et al. 2023): every GPU a data-parallel rank, ZeRO-3, no TP, PP
  or CP (``dp=N,tp=1,pp=1,cp=1,zero=3``).

The named alternatives keep the optimizer on the GPU (``offload_optimizer=false``): they are
the textbook strategies, not the planner's blends.
- ``megatron``: Megatron-LM style TP x PP (Narayanan et al. 2021 §3): TP inside a node (the
  largest valid degree up to the GPUs per node that leaves room for a pipeline), sequence
  parallel, 1F1B, ZeRO-1 (Megatron's distributed optimizer), no CP; the pipeline is as deep as
  needed: the smallest pp >= 2 that fits.
- ``dp-recompute``: data parallel with the distributed optimizer (ZeRO-1) and full activation
  recomputation (Chen et al. 2016), no TP, PP or CP.
- ``runners-up``: the plan's runners-up (``runner-up-1``, ...), each re-planned with every
  dimension pinned, so that its plan carries the full breakdown.

A strategy that fits nowhere is returned with its reason and the least memory it needs, never
raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..planner.api import NoFeasiblePlanError, make_plan
from ..planner.capabilities import precision_gap
from ..planner.cluster import Cluster
from ..planner.config import TrainConfig
from ..planner.cost.rules import ProblemShape, violation
from ..planner.intmath import divisors
from ..planner.model import ModelProfile
from ..planner.pins import Pins
from ..planner.plan import Plan, RunnerUp
from ..planner.strategy import Recompute, Schedule

STRATEGY_NAMES = ("plan", "fsdp", "megatron", "dp-recompute", "runners-up")
"""Names `--strategies` accepts, in the default order of the report."""
LABELS = {
    "plan": "paraplan plan",
    "fsdp": "pure FSDP",
    "megatron": "Megatron TP x PP",
    "dp-recompute": "DP + full recompute",
}
"""Human names of the named strategies (runners-up are "runner-up #k")."""
MEGATRON_ZERO_STAGE = 1
"""Megatron-LM's distributed optimizer shards optimizer states over data parallel: ZeRO-1."""
DP_RECOMPUTE_ZERO_STAGE = 1
"""DP + full recompute keeps ZeRO-1 (the distributed optimizer, as Megatron and DeepSpeed run
data parallel today); ZeRO-0 would replicate the optimizer states on every GPU."""


class Status(StrEnum):
    """Outcome of planning one strategy."""

    FITS = "fits"
    """A plan that fits in memory."""
    DOES_NOT_FIT = "does not fit"
    """Valid, but every variant needs more memory than a GPU has."""
    NOT_VALID = "not valid"
    """No configuration of this strategy exists here (e.g. the batch does not divide)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Compared:
    """One strategy of the comparison, planned."""

    name: str
    """Short name: plan, fsdp, megatron, dp-recompute, runner-up-<k> (file and colour key)."""
    label: str
    """Human name for tables and legends."""
    pins: str
    """The pinned dimensions in `--fix` form ('' for the plan)."""
    status: Status
    """Whether it fits."""
    reason: str
    """Why it does not fit or is not valid ('' when it fits)."""
    plan: Plan | None
    """The plan (None when nothing could be planned)."""
    least_memory_bytes: float | None = None
    """When it does not fit: the least memory per GPU any of its variants needs."""

    @property
    def fits(self) -> bool:
        """Whether it has a plan that fits."""
        return self.status == Status.FITS and self.plan is not None


def parse_strategies(text: str) -> tuple[str, ...]:
    """`--strategies`: a comma list of `STRATEGY_NAMES` (duplicates dropped, order kept)."""
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in STRATEGY_NAMES:
            raise ValueError(
                f"--strategies: unknown strategy {raw.strip()!r}; use a comma list of "
                f"{', '.join(STRATEGY_NAMES)} (e.g. plan,fsdp,megatron)"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"--strategies is empty; use a comma list of {', '.join(STRATEGY_NAMES)}")
    return tuple(names)


def runner_up_pins(r: RunnerUp) -> Pins:
    """Every dimension of a runner-up, pinned (its mesh order is searched: the fastest one)."""
    return Pins.of(r.strategy())


class _Planner:
    """Plans strategies for one model, cluster and training config."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, train: TrainConfig) -> None:
        self.profile, self.cluster, self.train = profile, cluster, train
        self.shape = ProblemShape.of(profile, cluster, train)

    def run(self, name: str, label: str, pins: Pins, top_k: int = 0) -> Compared:
        """Plan with `pins`; a failure becomes a `Compared` with its reason. The named
        baselines (FSDP, Megatron-style, ...) are what those frameworks run, so they are
        planned whether or not paraplan's executor runs them (`any_engine`); the plan and
        its runners-up are the executor's, unless the executor does not train in the asked
        precision (fp8, fp16): then they are any engine's too."""
        text = pins.describe()
        baseline = name in ("fsdp", "dp-recompute", "megatron")
        baseline = baseline or precision_gap(self.train.precision) is not None
        try:
            outcome = make_plan(
                self.profile,
                self.cluster,
                self.train,
                pins=pins,
                top_k=top_k,
                any_engine=baseline,
            )
        except NoFeasiblePlanError as exc:
            least = exc.least.memory.total_bytes if exc.least is not None else None
            return Compared(
                name=name,
                label=label,
                pins=text,
                status=Status.DOES_NOT_FIT,
                reason=str(exc),
                plan=None,
                least_memory_bytes=least,
            )
        except ValueError as exc:  # no structurally valid configuration with these pins
            return Compared(
                name=name,
                label=label,
                pins=text,
                status=Status.NOT_VALID,
                reason=str(exc),
                plan=None,
            )
        plan = outcome.plan
        if not plan.feasible:  # every dimension pinned: the plan is returned marked infeasible
            return Compared(
                name=name,
                label=label,
                pins=text,
                status=Status.DOES_NOT_FIT,
                reason=plan.infeasible_reason,
                plan=plan,
                least_memory_bytes=plan.predicted.memory_per_gpu_bytes,
            )
        return Compared(name=name, label=label, pins=text, status=Status.FITS, reason="", plan=plan)

    def uneven_batch(self, name: str, pins: Pins) -> Compared | None:
        """A data-parallel-only baseline (dp = every GPU) whose global batch does not split
        into dp equal shares: not valid, saying why and which batches would do. The
        comparison keeps the asked batch rather than silently changing it for one row."""
        dp, batch = self.cluster.num_gpus, self.train.global_batch
        if batch % dp == 0:
            return None
        lower = batch // dp * dp
        nearest = " or ".join(str(x) for x in (lower, lower + dp) if x > 0)
        return Compared(
            name=name,
            label=LABELS[name],
            pins=pins.describe(),
            status=Status.NOT_VALID,
            plan=None,
            reason=f"it makes each of the {dp} GPUs a data-parallel rank (dp={dp}), and the "
            f"global batch of {batch} sequences does not split into {dp} equal shares; give "
            f"a global batch that is a multiple of {dp} to compare it (e.g. --global-batch "
            f"{nearest})",
        )

    def fsdp(self) -> Compared:
        n = self.cluster.num_gpus
        pins = Pins(dp=n, tp=1, pp=1, cp=1, zero_stage=3, offload_optimizer=False)
        return self.uneven_batch("fsdp", pins) or self.run("fsdp", LABELS["fsdp"], pins)

    def dp_recompute(self) -> Compared:
        n = self.cluster.num_gpus
        pins = Pins(
            dp=n,
            tp=1,
            pp=1,
            cp=1,
            zero_stage=DP_RECOMPUTE_ZERO_STAGE,
            recompute=Recompute.FULL,
            offload_optimizer=False,
        )
        return self.uneven_batch("dp-recompute", pins) or self.run(
            "dp-recompute", LABELS["dp-recompute"], pins
        )

    def megatron(self) -> Compared:
        p, n, gpn = self.profile, self.cluster.num_gpus, self.cluster.gpus_per_node
        label = LABELS["megatron"]
        tps = [
            d
            for d in divisors(n)
            if d <= gpn and n // d >= 2 and violation(self.shape, Pins(tp=d)) is None
        ]
        if not tps:
            return Compared(
                name="megatron",
                label=label,
                pins="",
                status=Status.NOT_VALID,
                plan=None,
                reason=f"TP x PP needs at least 2 GPUs and a TP degree dividing heads={p.heads} "
                f"and ffn={p.ffn}; the cluster has {n} GPU(s)",
            )
        tp = max(tps)
        pps = [d for d in divisors(n // tp) if 2 <= d <= p.num_blocks]
        if not pps:
            return Compared(
                name="megatron",
                label=label,
                pins=f"tp={tp}",
                status=Status.NOT_VALID,
                plan=None,
                reason=f"no pipeline depth >= 2 divides {n // tp} GPUs per TP group "
                f"within the {p.num_blocks} blocks",
            )
        failed: list[Compared] = []
        for pp in pps:  # as deep as needed: the first pipeline depth that fits
            pins = Pins(
                tp=tp,
                pp=pp,
                cp=1,
                sequence_parallel=tp > 1,
                schedule=Schedule.ONE_F_ONE_B,
                zero_stage=MEGATRON_ZERO_STAGE,
                offload_optimizer=False,
            )
            got = self.run("megatron", label, pins)
            if got.fits:
                return got
            failed.append(got)
        sized = [c for c in failed if c.least_memory_bytes is not None]
        if sized:
            least = min(sized, key=lambda c: c.least_memory_bytes or 0.0)
            tried = f"pp={pps[0]}" if len(pps) == 1 else f"pp in ({', '.join(map(str, pps))})"
            return Compared(
                name="megatron",
                label=label,
                pins=least.pins,
                plan=least.plan,
                status=Status.DOES_NOT_FIT,
                least_memory_bytes=least.least_memory_bytes,
                reason=f"with tp={tp} and {tried}: {least.reason}",
            )
        return failed[-1]


def step_count(names: Sequence[str], top_k: int) -> int:
    """Planning steps `compare_strategies` reports to `on_step` (runners-up: at most top_k)."""
    named = [x for x in names if x not in ("plan", "runners-up")]
    main = int("plan" in names or "runners-up" in names)
    return main + len(named) + (top_k if "runners-up" in names else 0)


def compare_strategies(
    profile: ModelProfile,
    cluster: Cluster,
    train: TrainConfig,
    *,
    names: Sequence[str] = STRATEGY_NAMES,
    top_k: int = 3,
    on_step: Callable[[str], None] | None = None,
) -> tuple[Compared, ...]:
    """Plan each strategy of `names` (see the module docstring), in that order; ``runners-up``
    expands to one entry per runner-up of the plan (at most `top_k`). `on_step(label)` is called
    after each planning step (`step_count` of them at most)."""
    unknown = [x for x in names if x not in STRATEGY_NAMES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; use names from {STRATEGY_NAMES}")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0")
    planner = _Planner(profile, cluster, train)

    def step(label: str) -> None:
        if on_step is not None:
            on_step(label)

    main: Compared | None = None
    if "plan" in names or "runners-up" in names:
        main = planner.run("plan", LABELS["plan"], Pins(), top_k=top_k)
        step(LABELS["plan"])
    out: list[Compared] = []
    for name in dict.fromkeys(names):
        if name == "plan" and main is not None:
            out.append(main)
        elif name == "runners-up" and main is not None and main.plan is not None:
            for k, r in enumerate(main.plan.runners_up, 1):
                label = f"runner-up #{k}"
                out.append(planner.run(f"runner-up-{k}", label, runner_up_pins(r)))
                step(label)
        elif name == "fsdp":
            out.append(planner.fsdp())
            step(LABELS[name])
        elif name == "megatron":
            out.append(planner.megatron())
            step(LABELS[name])
        elif name == "dp-recompute":
            out.append(planner.dp_recompute())
            step(LABELS[name])
    return tuple(out)
