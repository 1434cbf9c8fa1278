"""How the search offers PowerSGD, offload and the asynchronous pipeline.

Two of them change the training math (PowerSGD approximates the gradient; PipeDream-2BW
applies it one step late), so the search offers them only with the user's consent
(`--allow-compression`, `--allow-async`) or a pin. Offload changes only where bytes live, so
it is always searched, but only where it can matter: it adds PCIe time and never makes a step
faster, so the search tries it on a strategy that does not fit without it (`rescues`).
The cost terms are in `cost/compression.py`, `cost/offload.py` and `cost/options.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from .cost.compression import POWERSGD_RANKS
from .cost.evaluate import Evaluator
from .cost.hidden import HiddenCosts
from .cost.options import ASYNC_STALENESS_STEPS, HOST_MEMORY_BYTES_PER_GPU, option_problem
from .frameworks import FrameworkSpace
from .pins import Pins
from .strategy import Recompute, Schedule, Strategy


@dataclass(frozen=True, kw_only=True, slots=True)
class Consent:
    """Options that change the training math, which the search offers only when asked."""

    compression: bool = False
    """Offer PowerSGD gradient compression (`--allow-compression`)."""
    async_pipeline: bool = False
    """Offer the asynchronous PipeDream-2BW pipeline (`--allow-async`)."""

    @property
    def any(self) -> bool:
        """Whether any option is offered (the search's time bounds then loosen)."""
        return self.compression or self.async_pipeline


RESCUED_RECOMPUTE = (Recompute.NONE, Recompute.FULL)
"""Recompute policies whose strategies the search tries offload on when they do not fit."""
NO_CONSENT = Consent()
"""The default: nothing that changes the training math."""

_OPTION_KEYS = ("powersgd_rank", "offload_params", "offload_activations", "async_pipeline")


def pinned_options(pins: Pins) -> dict[str, Any]:
    """The options `pins` fixes, as `Strategy` keyword arguments."""
    return {k: getattr(pins, k) for k in _OPTION_KEYS if getattr(pins, k) is not None}


def admits(pins: Pins, zero_stage: int, offload_optimizer: bool) -> bool:
    """Whether a (zero stage, optimizer offload) choice goes with the pinned options."""
    if pins.offload_params and (zero_stage != 3 or not offload_optimizer):
        return False
    return pins.powersgd_rank is None or zero_stage <= 1


def params_follow_optimizer(
    pins: Pins, runnable_only: bool, space: FrameworkSpace | None = None
) -> bool:
    """Whether the search's ZeRO-3 optimizer offload also offloads the parameter shards: in a
    search for the executor, which offloads through FSDP2's `CPUOffloadPolicy` (sharded
    parameters, gradients and the optimizer step on the host, each shard copied in for its
    all-gather; torchtitan's offload is the same policy), unless `offload_params` is pinned.
    DeepSpeed offloads the optimizer alone (`offload_optimizer` without `offload_param`), so
    a search for any engine keeps both choices; a search for a framework, as it offloads
    (`FrameworkSpace.offload_optimizer_alone`: Megatron-LM's `--optimizer-cpu-offload`)."""
    follows = runnable_only if space is None else not space.offload_optimizer_alone
    return follows and pins.offload_params is None


def admits_schedule(pins: Pins, schedule: Schedule) -> bool:
    """Whether a schedule goes with a pinned asynchronous pipeline."""
    return not pins.async_pipeline or schedule == Schedule.ONE_F_ONE_B


def pins_problem(pins: Pins) -> str | None:
    """Why the pinned options cannot go with the other pins (None when they can)."""
    probe = Strategy(
        dp=pins.dp or 2,
        tp=pins.tp or 1,
        pp=pins.pp or 2,
        cp=pins.cp or 1,
        zero_stage=pins.zero_stage if pins.zero_stage is not None else 0,
        schedule=pins.schedule or Schedule.ONE_F_ONE_B,
        offload_optimizer=pins.offload_optimizer if pins.offload_optimizer is not None else True,
        **pinned_options(pins),
    )
    if pins.offload_params and pins.zero_stage is None:
        probe = replace(probe, zero_stage=3)
    if pins.pp is None and pins.async_pipeline is not True:
        probe = replace(probe, pp=1, schedule=Schedule.NONE)
    if pins.dp is None and pins.cp is None and probe.dp * probe.cp == 1:
        probe = replace(probe, dp=2)
    return option_problem(probe)


def optimistic(pins: Pins, consent: Consent, s: Strategy) -> Strategy:
    """`s` for a time bound: with the asynchronous pipeline offered, as if it took it (no
    fill or drain), so that the bound holds for its variants too."""
    if consent.async_pipeline and s.pp > 1 and pins.async_pipeline is None:
        return replace(s, async_pipeline=True)
    return s


def fits_host(ev: Evaluator, s: Strategy) -> bool:
    """Whether the host memory holds what `s` offloads (`HOST_MEMORY_BYTES_PER_GPU`)."""
    return ev.options.host_bytes(s, ev.profile.num_params) <= HOST_MEMORY_BYTES_PER_GPU


def fit_variants(s: Strategy, pins: Pins, consent: Consent) -> list[Strategy]:
    """Variants of a strategy that fits which may be faster: PowerSGD at each searched rank,
    the asynchronous pipeline, and both (each only with consent and unless pinned)."""
    if not consent.any:
        return []
    ranks: list[int | None] = [s.powersgd_rank]
    if consent.compression and pins.powersgd_rank is None and s.zero_stage <= 1:
        ranks += [r for r in POWERSGD_RANKS if s.dp * s.cp > 1]
    asyncs = [s.async_pipeline]
    can_async = s.pp > 1 and s.schedule == Schedule.ONE_F_ONE_B
    if consent.async_pipeline and pins.async_pipeline is None and can_async:
        asyncs.append(True)
    out = []
    for rank, asy in itertools.product(dict.fromkeys(ranks), dict.fromkeys(asyncs)):
        v = replace(s, powersgd_rank=rank, async_pipeline=asy)
        if v != s and option_problem(v) is None:
            out.append(v)
    return out


def rescuable(ev: Evaluator, s: Strategy, pins: Pins) -> bool:
    """A cheap necessary condition for `rescues` to fit: without parameter offload, what
    every stage holds whatever the micro-batch (model states, buffers) must fit, since
    activation offload frees only activations."""
    if pins.offload_params is None and s.zero_stage == 3 and s.offload_optimizer:
        return True
    sm = ev.stage_model
    dpcp = s.dp * s.cp
    statics = ev.static_totals(
        sm.stages(sm.layout_of(s)),
        s.tp,
        s.ep_dp,
        dpcp,
        s.zero_stage,
        s.offload_optimizer,
        s.dp_replicate,
    )  # each stage's `ev.static_memory(s, stage).total_bytes`
    return max(statics) + ev.pipeline_buffer_bytes(s) <= ev.capacity_bytes


def rescues(s: Strategy, pins: Pins) -> list[list[Strategy]]:
    """Variants of a strategy that does not fit which need less memory, in tiers tried in
    turn until one fits: activation offload or parameter offload (ZeRO-3 with optimizer
    offload), then both; unless pinned."""
    acts = [s.offload_activations]
    if pins.offload_activations is None and not s.offload_activations:
        acts.append(True)
    params = [s.offload_params]
    if pins.offload_params is None and s.zero_stage == 3 and s.offload_optimizer:
        params.append(True)
    tiers: list[list[Strategy]] = [[], []]
    for a, p in itertools.product(acts, params):
        v = replace(s, offload_activations=a, offload_params=p)
        if v != s and option_problem(v) is None:
            both = a != s.offload_activations and p != s.offload_params
            tiers[int(both)].append(v)
    return [t for t in tiers if t]


def hidden_costs(ev: Evaluator, s: Strategy) -> HiddenCosts:
    """The options' hidden costs for a plan's strategy, on its bounding stages."""
    sm = ev.stage_model
    lay = sm.layout_of(s)
    stages = sm.stages(lay)
    compute = sm.stage_compute(lay, s.tp, s.cp, s.ep_dp, s.micro_batch_size)
    m = ev.num_microbatches(s)
    mem = ev.memory(s)[0]
    uncompressed = compute_s = 0.0
    wire_ratio = 1.0
    if s.powersgd_rank is not None:
        links = ev.links(s)
        costs = [ev.options.powersgd.cost(s, st, links.dpcp, ev.coll, ev.train) for st in stages]
        worst = max(costs, key=lambda c: c.compute_s + c.comm_s)
        compute_s = worst.compute_s
        wire_ratio = worst.wire_bytes / worst.gradient_bytes if worst.gradient_bytes else 1.0
        uncompressed = ev.time(replace(s, powersgd_rank=None)).step_time_s
    pcie = exposed = saved = 0.0
    if s.offload_params or s.offload_activations:
        policy = ev.policy(s)
        costs_o = [
            ev.options.offload.cost(s, st, c, policy) for st, c in zip(stages, compute, strict=True)
        ]
        pcie = m * max(c.pcie_bytes for c in costs_o)
        exposed = m * max(c.exposed_s for c in costs_o)
        plain = replace(s, offload_params=False, offload_activations=False)
        saved = max(0.0, ev.memory(plain)[0].total_bytes - mem.total_bytes)
    return HiddenCosts(
        powersgd_rank=s.powersgd_rank or 0,
        uncompressed_step_time_s=uncompressed,
        compression_compute_s=compute_s,
        compression_wire_ratio=wire_ratio,
        error_feedback_bytes=max(ev.options.error_feedback_bytes(s, st) for st in stages),
        offload_pcie_bytes=pcie,
        offload_exposed_s=exposed,
        offload_host_bytes=ev.options.host_bytes(s, ev.profile.num_params),
        offload_saved_bytes=saved,
        stashed_weight_bytes=mem.params_bytes if s.async_pipeline else 0.0,
        staleness_steps=ASYNC_STALENESS_STEPS if s.async_pipeline else 0,
    )
