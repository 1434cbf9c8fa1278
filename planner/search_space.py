"""The search space (`search.py`): candidate degrees, micro-batch sizes, schedules and the
choices searched, in blocks (`search_blocks.Block`), and the mesh orders of a strategy (and
the fastest of them)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import TypeVar

from . import options
from .cost.comm import Links
from .cost.evaluate import Estimate, Evaluator
from .cost.memory import MemoryBreakdown
from .frameworks import FrameworkSpace
from .intmath import divisors
from .pins import Pins
from .search_blocks import Block
from .strategy import DEFAULT_MESH_ORDER, LOCALITY_RANK, MeshAxis, Recompute, Schedule, Strategy

MAX_VIRTUAL_STAGES = 8
"""Largest interleaving factor searched unless pinned: each chunk adds p2p sends, and
Narayanan et al. 2021 (Fig. 12) report gains flattening out by a handful of chunks."""
MAX_MICRO_BATCH = 64
"""Largest micro-batch size searched unless pinned."""
MIN_TOKENS_PER_CP_RANK = 1024
"""Context parallelism is searched only while every rank keeps at least this many tokens of a
sequence (unless pinned): below that, each ring step's latency outweighs its attention block
(ring attention works on blocks of thousands of tokens, Liu et al. 2023 §3)."""
_T = TypeVar("_T")


def _options(pinned: _T | None, default: list[_T]) -> list[_T]:
    """The pinned value alone, or every default candidate."""
    return default if pinned is None else [pinned]


def mesh_orders(s: Strategy) -> list[tuple[MeshAxis, ...]]:
    """Distinct rank layouts: permutations of the axes larger than 1 (size-1 axes stay put)."""
    slots = [i for i, a in enumerate(DEFAULT_MESH_ORDER) if s.axis_size(a) > 1]
    movers = [DEFAULT_MESH_ORDER[i] for i in slots]
    orders = []
    for perm in itertools.permutations(movers):
        order = list(DEFAULT_MESH_ORDER)
        for i, axis in zip(slots, perm, strict=True):
            order[i] = axis
        orders.append(tuple(order))
    return orders


def orders_of(s: Strategy, space: FrameworkSpace | None) -> list[tuple[MeshAxis, ...]]:
    """The mesh orders searched for `s`: every distinct one (`mesh_orders`), or a framework's
    fixed order (`DEFAULT_MESH_ORDER`, torchtitan's and Megatron-LM's)."""
    return mesh_orders(s) if space is None else [DEFAULT_MESH_ORDER]


def best_order(
    ev: Evaluator,
    s: Strategy,
    memory: MemoryBreakdown,
    peak_stage: int,
    space: FrameworkSpace | None = None,
) -> Estimate:
    """The strategy in its fastest mesh order (ties broken by `sort_key`) of those searched
    for the framework's `space` (`orders_of`), with its `memory` (the same in every order)
    peaking on `peak_stage`."""
    # Time depends on the mesh order only through the links each group gets: orders with
    # equal links tie exactly, and the tie goes to the smallest `sort_key`.
    # Orders of one strategy differ in `sort_key` only by their locality ranks.
    by_links: dict[Links, tuple[tuple[int, ...], tuple[MeshAxis, ...]]] = {}
    for order in orders_of(s, space):
        links = ev.links_in_order(s, order)
        rank = tuple(LOCALITY_RANK[a] for a in reversed(order))
        known = by_links.get(links)
        if known is None or rank < known[0]:
            by_links[links] = (rank, order)
    timed = [(ev.time(so), so) for so in (replace(s, mesh_order=o) for _, o in by_links.values())]
    tb, so = min(timed, key=lambda x: (x[0].step_time_s, x[1].sort_key()))
    return ev.finish(so, memory, peak_stage, tb)


def space_blocks(
    ev: Evaluator,
    pins: Pins,
    *,
    params_follow: bool = False,
    space: FrameworkSpace | None = None,
) -> Iterator[Block]:
    """The space in blocks that share degrees and micro-batch size, valid or not, within what a
    framework runs (`space`: its schedules, ZeRO stages, recompute and offload; None: all);
    with `params_follow`, ZeRO-3's optimizer offload takes the parameters with it (`Block`)."""
    f, t = pins, ev.train
    n = ev.cluster.num_gpus
    divs = divisors(n)
    # Candidate degrees: those the structural rules admit as a pin of their own.
    tps = _options(f.tp, [d for d in divs if ev.violation(Pins(tp=d)) is None])
    max_cp = max(1, t.seq_len // MIN_TOKENS_PER_CP_RANK)  # the largest cp searched unpinned
    cps = _options(f.cp, [d for d in divs if d <= max_cp and ev.violation(Pins(cp=d)) is None])
    pps = _options(f.pp, [d for d in divs if ev.violation(Pins(pp=d)) is None])
    experts = ev.profile.experts
    eps = _options(f.ep, [d for d in divisors(experts) if d <= n] if experts else [1])
    pinned_degrees = any(x is not None for x in (f.tp, f.cp, f.pp, f.dp))
    for tp, cp, pp, ep in itertools.product(tps, cps, pps, eps):
        if n % (tp * cp * pp) and not pinned_degrees:
            continue
        dp = f.dp if f.dp is not None else max(1, n // (tp * cp * pp))
        if dp * tp * cp * pp != n and not pinned_degrees:
            continue
        per_replica = t.global_batch // dp if t.global_batch % dp == 0 else 0
        mbss = _options(
            f.micro_batch_size,
            [d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH] if per_replica else [1],
        )
        scheds: list[tuple[Schedule, int]] = []
        if pp == 1:
            scheds.append((Schedule.NONE, 1))
        else:
            scheds += [(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1)]
            top_v = min(MAX_VIRTUAL_STAGES, ev.num_blocks // pp)
            scheds += [(Schedule.INTERLEAVED_1F1B, v) for v in range(2, top_v + 1)]
            scheds.append((Schedule.INTERLEAVED_ZB, 1))  # zero bubble (cost/schedules.py)
            if top_v >= 2:
                scheds += [(Schedule.ZBV, 2), (Schedule.DUALPIPEV, 2)]
        if f.schedule is not None:
            v_shaped = f.schedule in (Schedule.ZBV, Schedule.DUALPIPEV)
            fv = f.virtual_stages if f.virtual_stages is not None else 1 + v_shaped
            scheds = [x for x in scheds if x[0] == f.schedule] or [(f.schedule, fv)]
        if f.virtual_stages is not None:
            fv = f.virtual_stages
            scheds = [x for x in scheds if x[1] == fv] or [(x[0], fv) for x in scheds[:1]]
        scheds = [x for x in scheds if options.admits_schedule(f, x[0]) and _runs(space, pp, x)]
        rest = list(
            itertools.product(
                _options(f.sequence_parallel, [False, True] if tp > 1 else [False]),
                _options(f.zero_stage, [0, 1, 2, 3]),
                _options(f.offload_optimizer, [False, True]),
                _options(f.recompute, list(Recompute)),
            )
        )
        if f.offload_optimizer is None:
            rest = [r for r in rest if not (r[2] and r[1] == 0)]  # offload needs ZeRO >= 1
        rest = [r for r in rest if options.admits(f, r[1], r[2])]  # with the pinned options
        if space is not None:
            rest = [r for r in rest if _admits(space, r, params_follow)]
        shards = _dp_shards(ev, pins, dp, tp, cp)
        if space is not None and not space.hsdp:
            shards = [x for x in shards if x is None]
        for mbs, shard, etp in itertools.product(mbss, shards, _expert_tps(ev, f, space, tp)):
            base = Strategy(
                dp=dp,
                tp=tp,
                pp=pp,
                cp=cp,
                ep=ep,
                expert_tp=etp,
                sequence_parallel=etp is not None,  # the probe's: folded runs only under SP
                micro_batch_size=mbs,
                dp_shard=shard,
                **options.pinned_options(f),
            )
            sub = rest if shard is None else [r for r in rest if r[1] == 3]
            if etp is not None:  # folded experts run under sequence parallelism
                sub = [r for r in sub if r[0]]
            if space is not None and space.ep_in_shard and base.ep_dp > 1:
                # EP within the FSDP shard group: not beside DDP or ZeRO-1, nor over HSDP's
                # replicas (torchtitan's EP borrows only dp_shard, cp and tp)
                within = (base.shard_dp * cp) % base.ep_dp == 0
                sub = [r for r in sub if r[1] >= 2 and within]
            if sub and scheds:
                yield Block(base, tuple(scheds), tuple(sub), params_follow)


def _expert_tps(
    ev: Evaluator, pins: Pins, space: FrameworkSpace | None, tp: int
) -> list[int | None]:
    """The experts' TP degrees searched beside `tp`: None (split over TP as the dense layers)
    and, for a MoE model with tp > 1, 1 (whole experts, their group folded over the TP ranks)
    where the framework runs each (`space`; None: the executor, whose capabilities refuse MoE
    with TP); a pin picks one."""
    if not ev.profile.is_moe or tp == 1:
        return [None]
    split = space is None or space.split_experts
    found: list[int | None] = [None] if pins.expert_tp in (None, tp) and split else []
    if pins.expert_tp in (None, 1) and (space is None or space.fold_experts):
        found.append(1)
    return found


def _runs(space: FrameworkSpace | None, pp: int, sched: tuple[Schedule, int]) -> bool:
    """Whether the framework runs this pipeline schedule (`space`; None: any)."""
    return space is None or pp == 1 or sched[0] in space.schedules


def _admits(
    space: FrameworkSpace, choice: tuple[bool, int, bool, Recompute], params_follow: bool
) -> bool:
    """Whether the framework runs a (sp, ZeRO, optimizer offload, recompute) choice: its ZeRO
    stages, per-layer recompute only where it has it, and optimizer offload only as it does it
    (alone, or with the parameters under ZeRO-3: `FrameworkSpace.offload_optimizer_alone`)."""
    _, zero, off, rc = choice
    if zero not in space.zero_stages:
        return False
    if rc == Recompute.PER_LAYER and not space.per_layer_recompute:
        return False
    return not off or space.offload_optimizer_alone or (zero == 3 and params_follow)


def _dp_shards(ev: Evaluator, pins: Pins, dp: int, tp: int, cp: int) -> list[int | None]:
    """HSDP shard groups searched for these degrees: None (shard over all of dp) and the
    group that fills one node (tp x cp x dp_shard = GPUs per node), the layout torchtitan
    recommends; a `dp_shard` pin is taken as given (dp_shard = dp is plain)."""
    pinned = pins.dp_shard
    if pinned is not None:
        return [None if pinned == dp else pinned]
    gpn = ev.cluster.gpus_per_node
    shard = gpn // (tp * cp) if gpn % (tp * cp) == 0 else 0
    hsdp = 1 < shard < dp and dp % shard == 0 and pins.zero_stage in (None, 3)
    return [None, shard] if hsdp else [None]
