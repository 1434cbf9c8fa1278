"""The pieces of the outer search (`search.py`): the block, its unit of branch and bound, the
heap of the best strategies found, the work it defers, and the least-memory strategy when
nothing fits."""

from __future__ import annotations

import functools
import gc
import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ParamSpec, TypeVar

from . import options
from .capabilities import runnable_shape
from .cost.evaluate import Estimate, Evaluator
from .cost.layout import Layout
from .cost.memory import held_zero_stage, model_state_bytes
from .cost.options import has_options
from .pins import Pins
from .strategy import Recompute, Schedule, Strategy

STRATEGY_FIELDS = tuple(f.name for f in fields(Strategy))
"""`Strategy`'s field names, for building candidates from keywords."""
RECOMPUTE_RANK = {
    Recompute.NONE: 0,
    Recompute.SELECTIVE: 1,
    Recompute.FULL: 2,
    Recompute.PER_LAYER: 3,
}
"""Order of recompute policies by added time when several fit. `per_layer` is never slower
than a uniform policy that fits except through TP/EP collectives redone, so only `none`
fitting dominates it (the solver then picks `none` everywhere)."""
_P = ParamSpec("_P")
_R = TypeVar("_R")


def gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` with Python's cyclic garbage collector paused while it runs (its previous state
    restored after). The search makes few reference cycles but keeps hundreds of thousands of
    memo entries alive, which every full collection walks again: about a tenth of the search's
    time on issue 16's 1T GPT case. Reference counting still frees what the search drops.

    Before the collector resumes, what the search left alive goes to the oldest generation
    without a scan (`gc.freeze` then `gc.unfreeze`, unless the caller froze objects of its
    own): else the next young collection walks all of it (0.07 s after a 1T plan). The memos
    hold their objects weakly (`cost/memo.py`), so reference counting frees them with the
    evaluator; they do not wait for a full collection."""

    @functools.wraps(fn)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            if was:
                gc.enable()

    return paused


@dataclass(frozen=True, slots=True)
class Block:
    """Strategies sharing degrees and micro-batch size (one unit of the branch and bound)."""

    base: Strategy
    """Degrees, micro-batch size, HSDP shard and pinned options; the rest is filled in."""
    schedules: tuple[tuple[Schedule, int], ...]
    """(schedule, virtual stages) pairs searched."""
    rest: tuple[tuple[bool, int, bool, Recompute], ...]
    """(sequence parallel, ZeRO stage, optimizer offload, recompute) choices searched."""
    params_follow: bool = False
    """Whether ZeRO-3's optimizer offload takes the parameter shards with it (`offload_params`),
    as the executor runs it (`options.params_follow_optimizer`)."""
    _fields: dict[str, Any] = field(init=False, compare=False, repr=False)
    """The base's fields as keywords: building a candidate from them takes half the time of
    `dataclasses.replace`, and the search builds hundreds of thousands."""

    shape: tuple = field(init=False, compare=False, repr=False)
    """What the executor's capability checks read of the base (`capabilities.runnable_shape`),
    with `rest` and `params_follow`: blocks alike in it run the same choices
    (`runnable_choices`)."""

    def __post_init__(self) -> None:
        kwargs = {name: getattr(self.base, name) for name in STRATEGY_FIELDS}
        object.__setattr__(self, "_fields", kwargs)
        shape = runnable_shape(self.base)
        object.__setattr__(self, "shape", (shape, self.rest, self.params_follow))

    def probe(self, sched: Schedule | None = None, v: int = 1) -> Strategy:
        """A representative for the block-level structural checks: the base under the first
        schedule, or under `sched` with `v` virtual stages."""
        if sched is None:
            sched, v = self.schedules[0]
        return Strategy(**{**self._fields, "schedule": sched, "virtual_stages": v})

    def strategy(
        self, sched: Schedule, v: int, sp: bool, zero: int, off: bool, rc: Recompute
    ) -> Strategy:
        """One strategy of the block (default mesh order)."""
        fields = {
            **self._fields,
            "schedule": sched,
            "virtual_stages": v,
            "sequence_parallel": sp,
            "recompute": rc,
            "zero_stage": zero,
            "offload_optimizer": off,
        }
        if off and zero == 3 and self.params_follow:
            fields["offload_params"] = True
        return Strategy(**fields)

    def strategies(self) -> Iterator[Strategy]:
        """Each strategy of the block (default mesh order)."""
        for sched, v in self.schedules:
            for sp, zero, off, rc in self.rest:
                yield self.strategy(sched, v, sp, zero, off, rc)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """What the search found."""

    ranked: tuple[Estimate, ...]
    """The fastest memory-feasible strategies, best first (at most top_k + 1)."""
    evaluated: int
    """Structurally valid strategies considered (each mesh order counted once)."""
    min_memory: Estimate | None
    """When nothing fits: the valid strategy needing the least memory per GPU (exact). When
    something fits: the least-memory strategy among those the search visited."""

    @property
    def best(self) -> Estimate | None:
        """The winner, if anything fits."""
        return self.ranked[0] if self.ranked else None


class Neg:
    """Orders a sort key in reverse, so a min-heap keeps the worst candidate on top."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __lt__(self, other: Neg) -> bool:
        return self.key > other.key

    def __gt__(self, other: Neg) -> bool:
        return self.key < other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Neg) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def keep_best(heap: list[tuple], keep: int, est: Estimate) -> None:
    """Push `est` on the min-heap of the `keep` best (its top is the worst kept)."""
    entry = (-est.step_time_s, -est.memory.total_bytes, Neg(est.strategy.sort_key()), est)
    if len(heap) < keep:
        heapq.heappush(heap, entry)
    elif entry[:3] > heap[0][:3]:
        heapq.heapreplace(heap, entry)


RESCUE, PER_LAYER = range(2)
"""Kinds of the work `Search.run` defers (`Task`)."""


@dataclass(slots=True)
class Task:
    """Work on strategies of one schedule of a block that `Search.run` defers until the K-th
    best is known better: the offload rescues of one that does not fit (`RESCUE`) or the
    per-layer recompute solves of those of one (sp, ZeRO stage) (`PER_LAYER`, in the block's
    order)."""

    kind: int
    """`RESCUE` or `PER_LAYER`."""
    strategies: list[Strategy]
    """The strategies, in the block's order."""
    block: Block
    """Their block."""
    fitted: list[tuple[bool, int, bool, int]]
    """The strategies of their schedule that fit (`Search._fitted`), shared with it."""
    runnable: bool
    """Whether their schedule's choices were already filtered to those the executor runs."""
    key: float = float("inf")
    """The lowest lower bound it is queued under."""
    done: bool = False
    """Whether it was done (it may be queued again under a lower bound)."""
    exact: bool = True
    """Whether `key` is its strategies' own bound; a task is first queued under their
    family's (`FamilyBounds.bound_s`, shared and already known), and their own bounds are
    computed only if the search reaches it (then it is queued again under those)."""
    bounded: list[Strategy] = field(default_factory=list)
    """Per strategy, what its time is no less than: itself, or for a per-layer solve its
    rc=none sibling (built once, with it)."""


def least_memory(ev: Evaluator, blocks: list[Block], found: Estimate | None) -> Estimate | None:
    """When nothing fits: the exact least-memory valid strategy of `blocks` whose host holds
    what it offloads (or `found`, if it needs less). Memory grows with the micro-batch size,
    so each block's smallest micro-batch is enough to look at."""
    best = found
    smallest: dict[tuple, int] = {}
    for block in blocks:
        b = block.base
        key = (b.tp, b.cp, b.pp, b.ep, b.folded_experts, b.dp)
        smallest[key] = min(smallest.get(key, b.micro_batch_size), b.micro_batch_size)
    for block in blocks:
        b = block.base
        if b.micro_batch_size != smallest[(b.tp, b.cp, b.pp, b.ep, b.folded_experts, b.dp)]:
            continue
        for s in block.strategies():
            if s.recompute == Recompute.PER_LAYER or ev.violation(s) is not None:
                continue  # per_layer falls back to the least-memory uniform policy
            if not options.fits_host(ev, s):
                continue
            memory, stage = ev.memory(s)
            if best is None or memory.total_bytes < best.memory.total_bytes:
                best = ev.finish(s, memory, stage, ev.time(s))
    return best


def states_overflow(ev: Evaluator, s: Strategy) -> bool:
    """Whether what some stage of `s` holds whatever its activations (model states and
    pipeline buffers) already exceeds the memory: then no recompute policy fits. Not for
    options (offloaded states) nor one micro-batch without a pipeline (the gradients then
    grow as the activations are freed, `Evaluator.single_pass`)."""
    if has_options(s) or ev.single_pass(s):
        return False
    sm = ev.stage_model
    stages = sm.stages(sm.layout_of(s))
    static = max(
        ev.static_totals(
            stages, s.tp, s.ep_dp, s.dp * s.cp, s.zero_stage, s.offload_optimizer, s.dp_replicate
        )
    )
    return static + ev.pipeline_buffer_bytes(s) > ev.capacity_bytes


def states_overflow_all(
    ev: Evaluator,
    probe: Strategy,
    choices: tuple[tuple[bool, int, bool, Recompute], ...],
    known: dict[tuple, float],
) -> bool:
    """Whether every (sp, zero, offload, recompute) choice under `probe`'s block and schedule
    holds on some stage, whatever its activations, more than the memory: its static totals
    (`Evaluator.static_totals` of its layout's stages) and the pipeline buffers, the test of
    `static_rejects`, asked before anything else is priced. Then nothing of the schedule fits,
    nor do its offload rescues or option variants: beside a pipeline no option moves the
    static bytes off the GPU (parameter offload does only without one,
    `offload.OffloadModel.memory`), the options only add bytes or take activations away, and
    a strategy's memory is its stages' peak (`Evaluator.single_pass` needs pp 1). False
    without a pipeline. Stops at the first choice that may fit. `known`: the search's memo of
    the largest stage total, by layout (which lives as long as the stage model, so its id is
    not reused), ZeRO stage and optimizer offload, and of `states_floor_bytes` (asked first)."""
    s = probe
    if s.pp == 1:
        return False
    sm, cap = ev.stage_model, ev.capacity_bytes
    tp, ep, dpcp, replicate = s.tp, s.ep_dp, s.dp * s.cp, s.dp_replicate
    edges: dict[bool, float] = {}
    layouts: dict[tuple[bool, Recompute], Layout] = {}
    over: dict[tuple[bool, int, bool], bool] = {}  # by (sp, zero, off): over the floor
    for sp, zero, off, rc in choices:
        above = over.get((sp, zero, off))
        if above is None:
            edge = edges.get(sp)
            if edge is None:
                edge = edges[sp] = ev.pipeline_buffer_bytes(s, sp)
            floor_key = (s.pp, tp, ep, dpcp, zero, off, replicate)
            floor = known.get(floor_key)
            if floor is None:
                floor = known[floor_key] = states_floor_bytes(ev, s, zero, off)
            above = over[(sp, zero, off)] = floor + edge > cap
        if above:
            continue  # whatever its layout
        edge = edges[sp]
        lay = layouts.get((sp, rc))
        if lay is None:
            lay = layouts[(sp, rc)] = sm.layout(s.pp, s.virtual_stages, rc, tp, sp, s.schedule)
        key = (id(lay), ep, dpcp, zero, off, replicate)
        most = known.get(key)
        if most is None:
            most = known[key] = max(
                ev.static_totals(sm.stages(lay), tp, ep, dpcp, zero, off, replicate)
            )
        if most + edge <= cap:
            return False
    return True


def states_floor_bytes(ev: Evaluator, s: Strategy, zero: int, off: bool) -> float:
    """A bound below the largest static total (`Evaluator.static_totals`) of any layout's
    stages for `s`'s degrees, ZeRO stage `zero` and optimizer offload `off`, beside a pipeline
    (pp > 1, a valid strategy: every stage holds a block, so fewer layers than the model and
    ZeRO-1's parameters and gradients, `memory.held_zero_stage`). The stages' parameters add
    up to the model's (the last stage's copy of a tied embedding only adds) and their model
    states are linear in them (`memory.model_state_bytes`), so the busiest stage holds at
    least 1/pp of the model's; each holds the runtime's resident bytes beside."""
    sm, held = ev.stage_model, held_zero_stage(zero, True)
    dense = sum(x.params for x in ev.profile.layers) / s.tp
    expert = sum(x.expert_params for x in ev.profile.layers) / (s.tp * s.ep_dp)
    dpcp = s.dp * s.cp
    total = 0.0
    for count, ranks in ((dense, dpcp // s.dp_replicate), (expert, dpcp // s.ep_dp)):
        if count:
            total += sum(
                model_state_bytes(
                    count, shard_ranks=ranks, zero_stage=held, train=sm.train, offload_optimizer=off
                )
            )
    return total / s.pp + sm.acc.runtime_overhead_bytes


def static_rejects(
    ev: Evaluator,
    pins: Pins,
    probe: Strategy,
    choice: tuple[bool, int, bool, Recompute],
    total: float | None,
    static: tuple[float, ...] | None,
) -> bool:
    """Whether the search, its heap full, drops the strategy of `choice` under `probe`'s block
    and schedule (peak memory `total`, None for an unsolved per_layer) for what its stages hold
    whatever their activations, answered from its `static` totals (`memory_totals.memory_totals`;
    None: not known, so False) without building it: by `states_overflow` (per_layer) or, as it
    does not fit, by `options.rescuable` (and the recompute policies `Search._rescue` offers)."""
    sp, zero, off, rc = choice
    cap = ev.capacity_bytes
    if static is None or (total is not None and total <= cap):
        return False  # not known, or it fits
    if total is not None and rc not in options.RESCUED_RECOMPUTE:
        return True
    if total is not None and pins.offload_params is None and zero == 3 and off:
        return False  # `options.rescuable`: parameter offload may make it fit
    return max(static) + ev.pipeline_buffer_bytes(probe, sp) > cap


def rank_key(e: Estimate) -> tuple:
    """The ranking both the search and brute force use."""
    return (e.step_time_s, e.memory.total_bytes, e.strategy.sort_key())


def runnable_choices(
    block: Block,
    known: dict[tuple[Schedule, int], tuple],
    sched: Schedule,
    v: int,
    gap: Callable[[Strategy], bool],
) -> tuple[tuple[bool, int, bool, Recompute], ...]:
    """The choices of `block.rest` under this schedule that the executor runs (`gap`: whether
    it cannot run a strategy). What it runs depends on neither sequence parallelism nor the
    recompute policy (the search's `Job` carries no per-block decisions), so each (ZeRO stage,
    optimizer offload) pair is asked once; nor on more of the block than its `Block.shape`, so
    blocks alike in it share the answer (`known`: the answers of its shape, by schedule). A
    choice it does not run cannot rank, nor can its offload rescues (they only add offload,
    which no capability admits more readily), so once the heap is full it needs neither memory
    nor time."""
    found = known.get((sched, v))
    if found is not None:
        return found
    runs: dict[tuple[int, bool], bool] = {}
    out = []
    for choice in block.rest:
        sp, zero, off, rc = choice
        ok = runs.get((zero, off))
        if ok is None:
            ok = runs[(zero, off)] = not gap(block.strategy(sched, v, sp, zero, off, rc))
        if ok:
            out.append(choice)
    found = known[(sched, v)] = tuple(out)
    return found
