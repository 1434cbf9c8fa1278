"""A step-time lower bound shared by every ZeRO stage and offload choice of a strategy: the
search (`search.py`) prices it once for the (degrees, micro-batch, schedule, sequence
parallel, recompute) family and skips the whole family when it is already slower than the
K-th best, before any memory or time of its members is computed.

Validity: the step time of a strategy `s` in any mesh order is at least its step time with
every collective priced at the least of its sizes' links over the mesh orders
(`PlacementBound`, below), which is

    m * slow.per_microbatch_s + bubble(slow) + tail + optimizer

with `slow` the stage of largest `per_microbatch_s` (compute + recompute + TP/CP/EP/PP
communication + ZeRO's per-micro-batch traffic and offload copies). Every term this bound
leaves out is a non-negative number of seconds (`hidden_behind` never returns less than 0):
ZeRO's per-micro-batch share, the once-per-step tail, the optimizer step. So

- `m * max over stages of StageCore.per_microbatch_s` <= `m * slow.per_microbatch_s`;
- the fill and drain of a schedule without split backward are `fill_slots` slots of the slow
  stage, at least `fill_slots` times that maximum;
- a split-backward schedule's bubble is its replayed unit bubble at the slow stage's
  forward share times the slow stage's slot (`cost/schedules.py`): at least the least unit
  bubble over the stages' forward shares times that maximum, and each unit bubble at least
  what a chain of the replay's graph takes beyond the micro-batches' work
  (`schedules.bubble_bound_s`: no replay).

A split-backward layout keeps every stage (`Layout.per_stage`: their in-flight memory differs);
their seconds do not, except by the rounding of sums over different positions of the chain,
so the bound prices only the distinct stages (the layout without `per_stage`): its slot and
shares equal some stage's to a few ulps, which `SAFETY` and `_SHARE_NUDGE` absorb.

Collectives are priced by `cost/placement.PlacementBound`: each at the least time the real
model gives over the links a group of its size gets in some mesh order of the strategy's
degrees (a valid bound for every order, and much tighter than the fastest link with no latency
where a group must span nodes). `strategy_lower_bound_s` bounds one strategy the same way, with
its data-parallel, offload and optimizer terms.

`recompute=per_layer` is bounded with no recompute (same layout, recompute seconds and
redone collectives never negative). A relative margin of `SAFETY` absorbs the different
order of floating-point sums.
tests/test_search_bounds.py checks both bounds <= the true step time of every member in every
mesh order over sampled families of several models and clusters.
"""

from __future__ import annotations

from dataclasses import replace

from .config import Precision
from .cost.comm import Collectives, Links
from .cost.estimate import StageTime
from .cost.evaluate import Evaluator
from .cost.placement import PlacementBound
from .cost.schedules import bubble_bound_s, is_split_backward
from .cost.stage_core import StageCore
from .options import rescues
from .pins import Pins
from .search_blocks import Block
from .search_space import mesh_orders
from .solvers.replay_table import RATIO_DIGITS
from .strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy

SAFETY = 1e-9
"""Relative margin taken off the bound: its sums run in another order than the step time's."""
_SHARE_NUDGE = 1e-9
"""A forward share this close to a rounding boundary of the replay cache is tried on both
sides, so the bound never reads a neighbouring bin the step time did not."""
_FLOOR_MARGIN = 1e-6
"""Relative margin taken off `family_floor_s`: its sums telescope over the whole chain, the
stage cores' over each stage's layers."""


def fp8(ev: Evaluator) -> bool:
    """Whether `ev` prices fp8 training (its sequence-parallel forward gathers are fp8)."""
    return ev.train.precision == Precision.FP8


def _slot_lower_bound_s(ev: Evaluator, s: Strategy) -> float:
    """A bound on one pipeline slot of the busiest stage for these degrees and micro-batch
    size, whatever the layout, ZeRO stage, recompute or mesh order: the busiest stage does
    at least the average of the forward and backward compute plus the TP collectives every
    block and the embedding and head run (2 + 2 per block; all on the fastest link, no
    latency: `lower_bound_coll`), unless they hide under compute (`Runtime.tp_comm_overlap`:
    then only their contention shows, which this bound leaves out)."""
    sm = ev.stage_model
    total = sm.total_compute_s(s.tp, s.cp, s.ep_dp, s.micro_batch_size)
    if s.tp > 1 and not ev.train.runtime.tp_comm_overlap:
        act = s.micro_batch_size * sm.block_output_seq_bytes / s.cp
        ideal = Links.ideal_of(s.tp)
        coll = ev.lower_bound_coll
        # a sequence-parallel pair is an all-gather and a reduce-scatter of at least its
        # cost; under fp8 a forward pair's all-gather carries one byte an element
        gather = coll.all_gather(act / ev.train.act_bytes if fp8(ev) else act, ideal)
        unit = min(coll.all_reduce(act, ideal), gather + coll.all_gather(act, ideal))
        folded = 2 * ev.num_moe_blocks if s.folded_experts else 0  # `stage_core`'s units
        total += (4 * ev.num_blocks + 2 - folded) * unit
    return total / s.pp


def compute_lower_bound_s(ev: Evaluator, s: Strategy) -> float:
    """A bound no layout, schedule, ZeRO stage, recompute policy or mesh order beats for
    these degrees and micro-batch size: m slots plus the fill and drain of the most
    interleaved schedule possible, each at least `_slot_lower_bound_s`."""
    v_max = max(1, ev.num_blocks // s.pp)
    slots = ev.num_microbatches(s) + (0 if s.async_pipeline else (s.pp - 1) / v_max)
    return slots * _slot_lower_bound_s(ev, s)


def schedule_lower_bound_s(ev: Evaluator, s: Strategy) -> float:
    """Like `compute_lower_bound_s` for a pipeline shape: (m + (pp-1)/v) slots."""
    fill = 0.0 if is_split_backward(s.schedule) else ev.fill_slots(s)
    slots = ev.num_microbatches(s) + fill  # split backward: 0, a bound whatever F:B:W
    return slots * _slot_lower_bound_s(ev, s)


def family_key(s: Strategy) -> Strategy:
    """The member of `s`'s family the bound is computed for: what it leaves out (ZeRO stage,
    offloads, PowerSGD, HSDP shard, mesh order) set to a default, per_layer read as none."""
    rc = Recompute.NONE if s.recompute == Recompute.PER_LAYER else s.recompute
    if (
        s.zero_stage == 0
        and not (s.offload_optimizer or s.offload_params or s.offload_activations)
        and s.powersgd_rank is None
        and s.dp_shard is None
        and s.mesh_order == DEFAULT_MESH_ORDER
        and s.recompute == rc
    ):
        return s  # already its family's (as `fast_choices` asks): no copy
    return replace(
        s,
        zero_stage=0,
        offload_optimizer=False,
        offload_params=False,
        offload_activations=False,
        powersgd_rank=None,
        dp_shard=None,
        mesh_order=DEFAULT_MESH_ORDER,
        recompute=rc,
    )


def _family_shape(s: Strategy, rc: Recompute) -> tuple:
    """The fields of `s` a family bound reads (`family_key`'s), with recompute policy `rc`: the
    key of `FamilyBounds`' memos (a tuple hashes faster than the strategy)."""
    return _shape_of(s, s.sequence_parallel, s.schedule, s.virtual_stages, rc)


def _shape_of(base: Strategy, sp: bool, sched: Schedule, v: int, rc: Recompute) -> tuple:
    """`_family_shape` of `base` with these sequence parallelism, schedule and policy."""
    return (
        base.dp,
        base.tp,
        base.pp,
        base.cp,
        base.ep,
        base.folded_experts,
        sp,
        sched,
        v,
        base.micro_batch_size,
        rc,
        base.async_pipeline,
    )


def placement_bound(ev: Evaluator, s: Strategy) -> PlacementBound:
    """`PlacementBound` over the links of every mesh order of `s`'s degrees and HSDP shard."""
    key = (s.pp, s.dp, s.cp, s.tp, s.ep, s.folded_experts, s.dp_shard)
    links = [ev.links_in_order(s, order) for order in mesh_orders(s)]
    return PlacementBound(ev.acc, ev.coll, ev.lower_bound_coll, links, ("placement", *key))


def family_cores(ev: Evaluator, s: Strategy, coll: Collectives) -> tuple[StageCore, ...]:
    """The stage cores `family_lower_bound_s` prices `s` by: each distinct stage's (a split
    backward's layout keeps every stage; the bound needs only the distinct ones)."""
    return ev.stage_core(s, ev.ideal_links(s), coll, merged=True)


def family_lower_bound_s(
    ev: Evaluator,
    s: Strategy,
    coll: Collectives,
    *,
    offload_activations: bool = False,
    cores: tuple[StageCore, ...] | None = None,
) -> float:
    """A step time no member of `s`'s family (any ZeRO stage, offload, PowerSGD, HSDP shard,
    mesh order; per_layer for none) beats, with `coll` the lower-bound collectives (see the
    module docstring for why). `s` should be a `family_key`; `cores` its `family_cores`
    when known.

    With `offload_activations`: a bound for the members that offload activations (with or
    without parameters), whose slot on each stage also holds the exposed seconds of its
    activation copies (`OffloadModel.cost`, added to the stage's communication per
    micro-batch; the copies of offloaded parameters only add bytes, and exposed seconds never
    shrink as the bytes grow, `hidden_behind` being nondecreasing in them)."""
    cores = family_cores(ev, s, coll) if cores is None else cores
    slots = [c.per_microbatch_s for c in cores]
    if offload_activations:
        off = replace(s, offload_activations=True)
        policy, model = ev.policy(off), ev.options.offload
        slots = [
            x + model.cost(off, c.stage, c.compute, policy).exposed_s
            for x, c in zip(slots, cores, strict=True)
        ]
    slot = max(slots)
    m = ev.num_microbatches(s)
    shares = [(c.compute.fwd_s, c.compute.bwd_s) for c in cores]
    return (m * slot + least_bubble_s(ev, s, slot, shares)) * (1.0 - SAFETY)


def family_floor_s(ev: Evaluator, s: Strategy, coll: Collectives) -> float:
    """A step time below `family_lower_bound_s` of `s`'s family (a `family_key`; `coll` its
    `placement_bound`), without its stage cores: its slowest slot is at least the average over
    the pp stages of their forward, backward and recompute seconds and the TP collectives of
    their blocks (every layer runs on one stage: 4 per block, 2 more per fully recomputed one,
    as `stage_core` counts them; not when they hide under compute, and the rest of the
    communication left out), times m micro-batches plus the fill and drain slots of a
    schedule without split backward (a split backward's bubble left out)."""
    sm = ev.stage_model
    t = sm.layer_times(s.tp, s.cp, s.ep_dp, s.micro_batch_size)
    blocks = 4 * ev.num_blocks - (2 * ev.num_moe_blocks if s.folded_experts else 0)
    if s.recompute == Recompute.FULL:
        again = 2 * ev.num_blocks - (ev.num_moe_blocks if s.folded_experts else 0)
        recompute_s, blocks = t.full_recompute_s[-1], blocks + again
    elif s.recompute == Recompute.SELECTIVE:
        recompute_s = t.selective_recompute_s[-1]
    else:
        recompute_s = 0.0
    tp_s = 0.0
    if s.tp > 1 and not ev.train.runtime.tp_comm_overlap:
        act, link = s.micro_batch_size * sm.block_output_seq_bytes / s.cp, ev.ideal_links(s).tp
        if s.sequence_parallel:
            pair = coll.all_gather(act, link) + coll.reduce_scatter(act, link)
            tp_s = blocks * pair
            if fp8(ev):  # the forward pairs' all-gathers in fp8 (`stage_core`)
                bwd = 2 * ev.num_blocks - (ev.num_moe_blocks if s.folded_experts else 0)
                fwd = blocks - bwd
                small = coll.all_gather(act / ev.train.act_bytes, link)
                tp_s = fwd * (small + coll.reduce_scatter(act, link)) + bwd * pair
        else:
            tp_s = blocks * coll.all_reduce(act, link)
    slot = (t.fwd_s[-1] + t.bwd_s[-1] + recompute_s + tp_s) / s.pp
    fill = 0.0 if is_split_backward(s.schedule) else ev.fill_slots(s)
    return (ev.num_microbatches(s) + fill) * slot * (1.0 - _FLOOR_MARGIN)


def bound_stage_times(ev: Evaluator, s: Strategy, coll: Collectives) -> tuple[StageTime, ...]:
    """`ev.stage_times(s, ev.ideal_links(s), coll)`, as the bounds read it. Under a split
    backward with a uniform recompute policy, each distinct stage is priced once (the merged
    stages of `family_cores`, whose seconds equal those of the stages they stand for but for
    rounding, which `SAFETY` and `_SHARE_NUDGE` absorb) and handed to every pipeline stage
    that looks like it (`StageModel.stage_copies`), in the order `stage_times` gives them."""
    links = ev.ideal_links(s)
    lay = ev.stage_model.layout_of(s)
    if not lay.per_stage or s.recompute == Recompute.PER_LAYER:  # per_layer: solved per stage
        return ev.stage_times(s, links, coll)
    merged = ev.stage_times(s, links, coll, merged=True)
    copies = ev.stage_model.stage_copies(ev.stage_model.layouts.merged(lay))
    return tuple(merged[rep] for _, rep in copies)


def strategy_lower_bound_s(
    ev: Evaluator, s: Strategy, coll: Collectives, stages: tuple[StageTime, ...] | None = None
) -> float:
    """A step time no mesh order of `s` beats, with `coll` a `placement_bound` of `s` (or the
    fastest link with no latency): its stage times on ideal links, the slowest stage's slot,
    the largest once-per-step tail, and the bubble of the slowest slot at the least unit
    bubble of the stages' forward shares (the slowest stage may differ between the bound and
    a mesh order). `stages`: its `stage_times` on ideal links with `coll`, when known."""
    stages = bound_stage_times(ev, s, coll) if stages is None else stages
    slot = max(x.per_microbatch_s for x in stages)
    tail = max(x.tail_comm_s + x.optimizer_s for x in stages)
    m = ev.num_microbatches(s)
    shares = [(x.fwd_s, x.bwd_s) for x in stages]
    return (m * slot + least_bubble_s(ev, s, slot, shares) + tail) * (1.0 - SAFETY)


def per_layer_lower_bound_s(
    ev: Evaluator,
    s: Strategy,
    coll: Collectives,
    plain: Strategy | None = None,
    stages: tuple[StageTime, ...] | None = None,
) -> float:
    """`strategy_lower_bound_s` of a `per_layer` strategy without options, without solving
    its recompute: the stage times of its `none` sibling `plain` (the same layout; recompute
    only adds seconds and redone collectives) with each stage's `recompute_lower_bounds_s`
    added to its slot."""
    plain = replace(s, recompute=Recompute.NONE) if plain is None else plain
    if stages is None:  # `plain`'s on ideal links with `coll`, when not given
        stages = bound_stage_times(ev, plain, coll)
    extra = ev.per_layer.recompute_lower_bounds_s(s)
    slot = max(x.per_microbatch_s + r for x, r in zip(stages, extra, strict=True))
    tail = max(x.tail_comm_s + x.optimizer_s for x in stages)
    m = ev.num_microbatches(s)
    shares = [(x.fwd_s, x.bwd_s) for x in stages]
    return (m * slot + least_bubble_s(ev, s, slot, shares) + tail) * (1.0 - SAFETY)


def least_bubble_s(
    ev: Evaluator, s: Strategy, slot: float, shares: list[tuple[float, float]]
) -> float:
    """A bound on the fill and drain of `s` whose slowest slot is at least `slot`: `fill_slots`
    slots, or for a split backward the least unit bubble over the forward shares of the
    (forward, backward) seconds in `shares` (one per stage), each bounded without a replay
    (`bubble_bound_s`), times `slot`."""
    if not is_split_backward(s.schedule):
        return ev.fill_slots(s) * slot
    nudged: set[float] = set()
    for fwd_s, bwd_s in shares:
        total = fwd_s + bwd_s
        share = fwd_s / total if total > 0 else 0.5
        nudged.update((share - _SHARE_NUDGE, share, share + _SHARE_NUDGE))
    # `bubble_s` rounds the share to a bin and scales the bin's (non-negative) bubble by
    # forward + backward: per bin, the share with the least sum gives that bin's least.
    least: dict[float, tuple[float, float]] = {}
    for x in nudged:
        fwd = min(1.0, max(0.0, x))
        total = fwd + (1.0 - fwd)
        rounded = round(fwd / total, RATIO_DIGITS) if total > 0 else -1.0
        if rounded not in least or total < least[rounded][0]:
            least[rounded] = (total, fwd)
    unit = min(
        bubble_bound_s(
            s.schedule,
            pp=s.pp,
            virtual_stages=s.virtual_stages,
            num_microbatches=ev.num_microbatches(s),
            forward_s=fwd,
            backward_s=1.0 - fwd,
            weight_share=ev.weight_share,
        )
        for _, fwd in least.values()
    )
    return unit * slot


_FAMILY_RC = {
    Recompute.NONE: Recompute.NONE,
    Recompute.PER_LAYER: Recompute.NONE,  # bounded as none (`family_key`)
    Recompute.SELECTIVE: Recompute.SELECTIVE,
    Recompute.FULL: Recompute.FULL,
}
_FAMILY_ORDER = {
    (sp, rc): i
    for i, (rc, sp) in enumerate(
        (rc, sp)
        for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
        for sp in (True, False)
    )
}
"""Order `all_slower` asks families in: no recompute first, sequence parallel first."""


class FamilyBounds:
    """`family_lower_bound_s` memoized for one search (by what a `family_key` keeps)."""

    def __init__(self, ev: Evaluator, options_offered: bool, pins: Pins) -> None:
        self.ev = ev
        self.pins = pins
        """The search's pins (what `rescues` may vary)."""
        self.options_offered = options_offered
        """PowerSGD or the asynchronous pipeline offered: they may be faster than the
        strategy they vary, so `all_slower` never prunes."""
        self._bound_s: dict[tuple, float] = {}
        self._floor_s: dict[tuple, float] = {}
        self._offload_bound_s: dict[tuple, float] = {}
        self._acts_only: dict[tuple, bool] = {}
        self._cores: dict[tuple, tuple[StageCore, ...]] = {}
        self._placement: dict[tuple, PlacementBound] = {}

    def coll(self, s: Strategy) -> PlacementBound:
        """`placement_bound` of `s` (memoized by degrees and HSDP shard)."""
        key = (s.pp, s.dp, s.cp, s.tp, s.ep, s.folded_experts, s.dp_shard)
        found = self._placement.get(key)
        if found is None:
            found = self._placement[key] = placement_bound(self.ev, s)
        return found

    def bound_s(self, s: Strategy) -> float:
        """`family_lower_bound_s` of `s`'s family."""
        rc = Recompute.NONE if s.recompute == Recompute.PER_LAYER else s.recompute
        key = _family_shape(s, rc)
        bound = self._bound_s.get(key)
        if bound is None:
            key_s = family_key(s)
            cores = self._cores[key] = family_cores(self.ev, key_s, self.coll(key_s))
            bound = family_lower_bound_s(self.ev, key_s, self.coll(key_s), cores=cores)
            self._bound_s[key] = bound
        return bound

    def slower(self, s: Strategy, worst_s: float) -> bool:
        """Whether `bound_s(s)` exceeds `worst_s`, asking its family's floor first when its
        bound is not known yet (`family_floor_s`: below it, and needs no stage cores)."""
        rc = Recompute.NONE if s.recompute == Recompute.PER_LAYER else s.recompute
        bound = self._bound_s.get(_family_shape(s, rc))
        if bound is None:
            if self.floor_s(s) > worst_s:
                return True
            bound = self.bound_s(s)
        return bound > worst_s

    def floor_s(self, s: Strategy) -> float:
        """`family_floor_s` of `s`'s family (memoized as `bound_s`)."""
        rc = Recompute.NONE if s.recompute == Recompute.PER_LAYER else s.recompute
        key = _family_shape(s, rc)
        floor = self._floor_s.get(key)
        if floor is None:
            key_s = family_key(s)
            floor = self._floor_s[key] = family_floor_s(self.ev, key_s, self.coll(key_s))
        return floor

    def offload_bound_s(self, s: Strategy) -> float:
        """`family_lower_bound_s` of the members of `s`'s family that offload activations
        (for a uniform recompute policy: a per-layer solution keeps fewer bytes to copy)."""
        key = _family_shape(s, s.recompute)
        bound = self._offload_bound_s.get(key)
        if bound is None:
            key_s = family_key(s)
            bound = family_lower_bound_s(
                self.ev,
                key_s,
                self.coll(key_s),
                offload_activations=True,
                cores=self._cores.get(key),  # those of `bound_s` (the same key)
            )
            self._offload_bound_s[key] = bound
        return bound

    def rescue_floor_s(self, s: Strategy) -> float:
        """A step time none of `s`'s offload rescues (`options.rescues`) beats when they all
        offload activations: `offload_bound_s`; else 0 (and with options offered)."""
        if self.options_offered:
            return 0.0
        key = (  # all that `rescues` reads but the pins (its own and `option_problem`'s checks)
            s.powersgd_rank,
            s.zero_stage,
            s.dp * s.cp == 1,
            s.async_pipeline,
            s.pp == 1,
            s.schedule,
            s.offload_optimizer,
            s.offload_params,
            s.offload_activations,
        )
        if key not in self._acts_only:  # whether every rescue offloads activations
            tiers = rescues(s, self.pins)
            self._acts_only[key] = all(v.offload_activations for t in tiers for v in t)
        return self.offload_bound_s(s) if self._acts_only[key] else 0.0

    def fast_choices(
        self,
        block: Block,
        sched: Schedule,
        v: int,
        rest: tuple[tuple[bool, int, bool, Recompute], ...],
        worst_s: float,
    ) -> tuple[tuple[bool, int, bool, Recompute], ...]:
        """The (sp, ZeRO, offload, recompute) choices of `rest` under this schedule of `block`
        less those whose family is found slower than `worst_s` (none while nothing is found,
        or when options are offered): empty when every member is slower. Families are asked
        the likeliest to be fast first, up to the first that is not slower (the others are
        bounded later only if their members need it). A choice left out cannot rank, whatever
        its ZeRO stage, offloads and per-layer solve, nor can its offload rescues (they only
        add offload, which its family bound covers)."""
        if worst_s == float("inf") or self.options_offered:
            return rest
        families = {(sp, _FAMILY_RC[rc]) for sp, _, _, rc in rest}
        slower: set[tuple[bool, Recompute]] = set()
        for sp, rc in sorted(families, key=_FAMILY_ORDER.__getitem__):
            known = self._bound_s.get(_shape_of(block.base, sp, sched, v, rc))  # unbuilt
            if known is None:
                slow = self.slower(block.strategy(sched, v, sp, 0, False, rc), worst_s)
            else:
                slow = known > worst_s
            if not slow:
                break
            slower.add((sp, rc))
        else:
            return ()
        if not slower:
            return rest
        return tuple(c for c in rest if (c[0], _FAMILY_RC[c[3]]) not in slower)
