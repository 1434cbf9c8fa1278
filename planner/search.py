"""The outer search: enumerate strategies, prune by memory and by a time lower bound, rank.

Deterministic: strategies are ranked by (step time, peak memory, `Strategy.sort_key`), also when
several processes share a large search (`search_workers.py`; only the count of strategies
visited then varies). The pruning is exact: a strategy is skipped only when its memory does not
fit or when a lower bound on its step time (each collective at the least time of its group
size's links over the mesh orders, `search_bounds.py`) is already slower than the K-th best
found, so `search` returns the same optimum as `brute_force`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TypeVar

from . import options
from .capabilities import Job, executor_gaps
from .cost.data_parallel import HOST_OPTIMIZER_BYTES_PER_S
from .cost.estimate import StageTime
from .cost.evaluate import Estimate, Evaluator
from .cost.memory_totals import memory_totals
from .cost.options import has_options, option_problem
from .cost.rules import Rule, Violation
from .framework_pins import space_pins
from .frameworks import FrameworkSpace
from .model import dense_blocks
from .pins import Pins
from .search_blocks import (
    PER_LAYER,
    RECOMPUTE_RANK,
    RESCUE,
    Block,
    SearchResult,
    Task,
    gc_paused,
    least_memory,
    rank_key,
    runnable_choices,
    states_overflow,
    states_overflow_all,
    static_rejects,
)
from .search_bounds import (
    FamilyBounds,
    bound_stage_times,
    compute_lower_bound_s,
    per_layer_lower_bound_s,
    schedule_lower_bound_s,
    strategy_lower_bound_s,
)
from .search_space import best_order, orders_of, space_blocks
from .search_workers import Explored, Kept, Share, explore_shared, worker_count
from .strategy import Recompute, Schedule, Strategy

_T = TypeVar("_T")


class Search:
    """Enumerates the space for one evaluator, with pinned dimensions."""

    def __init__(
        self,
        ev: Evaluator,
        pins: Pins | None = None,
        *,
        runnable_only: bool = False,
        consent: options.Consent = options.NO_CONSENT,
        workers: int | None = None,
        space: FrameworkSpace | None = None,
    ) -> None:
        self.ev = ev
        self.space = space
        """What the framework planned for runs (`frameworks.py`), None: anything priced."""
        self.workers = workers
        """Processes `run` may use (`search_workers.worker_count`); None: by the space."""
        self.pins = pins if pins is not None else Pins()
        if space is not None:  # the options it lacks pinned off (ValueError: pinned on)
            self.pins = space_pins(self.pins, space, consent)
        self.runnable_only = runnable_only
        """Rank only strategies the executor runs (`capabilities.py`; the API and CLI ask for it
        unless told `any_engine`); False: the whole space the cost model prices."""
        self.consent = consent  # options changing the training math it may offer (`options.py`)
        self._unrunnable: str | None = None
        self._dense_blocks = bool(dense_blocks(ev.profile))  # the executor's EP needs none
        self._min_mem: tuple[float, Strategy] | None = None  # least memory `run` saw, and where
        # Offloading only adds time when the host streams no faster than HBM (true of every
        # catalog entry; a calibration could break it, and then offload is never pruned).
        self._offload_slower = ev.acc.memory_bw_bytes_per_s >= HOST_OPTIMIZER_BYTES_PER_S
        self._lb_s: dict[Strategy, float] = {}  # `_time_lower_bound_s`'s, and rc=none's
        self._plain_stages: dict[Strategy, tuple[StageTime, ...]] = {}  # stage times there
        self._statics: dict[tuple, float] = {}  # `states_overflow_all`'s memo
        self._runs: dict[tuple, dict[tuple[Schedule, int], tuple]] = {}
        """`_runnable` answers, by block shape, then by schedule."""
        self._families = FamilyBounds(ev, consent.any, self.pins)
        """Bounds shared by a strategy's ZeRO and offload variants (`search_bounds.py`)."""
        broken = ev.violation(self.pins)  # the rules the candidates obey, on the pins alone
        if broken is not None:
            named = self.pins.describe(broken.rule.fields) or self.pins.describe()
            raise ValueError(f"--fix {named}: {broken.message} (rule {broken.rule})")
        problem = options.pins_problem(self.pins)
        if problem is not None:
            raise ValueError(f"--fix {self.pins.describe()}: {problem}")

    @property
    def all_pinned(self) -> bool:
        """Whether --fix pins every main dimension (see `Pins.all_pinned`)."""
        return self.pins.all_pinned

    def blocks(self) -> Iterator[Block]:
        """The space in blocks that share degrees and micro-batch size, valid or not
        (`search_space.space_blocks`)."""
        follow = options.params_follow_optimizer(self.pins, self.runnable_only, self.space)
        return space_blocks(self.ev, self.pins, params_follow=follow, space=self.space)

    def configs(self) -> Iterator[Strategy]:
        """Every combination of the searched dimensions (default mesh order), valid or not."""
        for block in self.blocks():
            yield from block.strategies()

    def valid(self) -> Iterator[Strategy]:
        """Structurally valid strategies in every distinct mesh order."""
        for s in self.configs():
            if self.ev.violation(s) is None:
                for order in orders_of(s, self.space):
                    yield replace(s, mesh_order=order)

    @gc_paused
    def run(self, top_k: int = 3, progress: Callable[[float], None] | None = None) -> SearchResult:
        """The best `top_k + 1` feasible strategies, exactly, by best-first branch and bound:
        blocks are visited in order of their compute lower bound and the search stops when a
        block's bound is slower than the K-th best found. Once K are found, the costly work on
        one strategy (its per-layer recompute solve, its offload rescues, its time in every
        mesh order) waits in the same queue, keyed by a lower bound on its time, so that it is
        done only if the K-th best has not fallen below that bound by its turn. On a large
        space, several processes share the queue (`search_workers.py`): the same result."""
        keep = top_k + 1
        queue: list[tuple[float, int, Block | Task]] = []  # (lower bound, order, what)
        for block in self.blocks():
            broken = self.ev.violation(block.probe())
            optimist = options.optimistic(self.pins, self.consent, block.base)
            bound = float("inf") if broken else compute_lower_bound_s(self.ev, optimist)
            queue.append((bound, len(queue), block))
        heapq.heapify(queue)
        found = None
        workers = worker_count(len(queue), self.workers)
        if workers > 1:
            found = explore_shared(
                lambda share: self._explore(list(queue), keep, progress, share),
                len(queue),
                workers,
                keep,
            )
        if found is None:
            found = self._explore(queue, keep, progress, None)
        return self._finish(found)

    def _explore(
        self,
        queue: list[tuple[float, int, Block | Task]],
        keep: int,
        progress: Callable[[float], None] | None,
        share: Share | None,
    ) -> Explored:
        """`run`'s branch and bound over `queue` (a heap of its blocks, by bound): alone, or
        taking only the blocks it claims in `share` and pruning by the shared K-th best."""
        ev = self.ev
        pinned = bool(self.pins.pinned())
        kept = Kept(keep, share)
        worst_s = kept.worst_s
        evaluated = 0
        violations: Counter[Rule] = Counter()
        examples: dict[Rule, Violation] = {}
        self._min_mem = None

        def note(broken: Violation, count: int = 1) -> None:
            violations[broken.rule] += count
            examples.setdefault(broken.rule, broken)

        order = itertools.count(len(queue))
        num_blocks, done = len(queue), 0
        while queue:
            bound, index, item = heapq.heappop(queue)
            if bound > worst_s():
                break  # everything left is slower still
            if isinstance(item, Task):
                if not item.exact:  # queued under its family's bound: now under its own
                    item.exact = True
                    own = min(self._time_lower_bound_s(b) for b in item.bounded)
                    item.key = max(item.key, own)  # both bound all it may add
                    if item.key > bound:
                        heapq.heappush(queue, (item.key, next(order), item))
                        continue
                self._task(item, kept)
                continue
            block = item
            claimed = done + 1 if share is None else share.claim(index)
            if not claimed:
                continue  # another process explores it
            if progress is not None:
                progress(done / num_blocks)
            done = claimed
            runs = self._runs.setdefault(block.shape, {})  # its shape hashed once
            for sched, v in block.schedules:
                rest = block.rest
                runnable = kept.full() and self.runnable_only and not pinned
                if runnable:  # every choice left runs; asked first, as it is cheaper than the
                    rest = runnable_choices(block, runs, sched, v, self._gap)  # rules and bounds
                    evaluated += len(block.rest) - len(rest)  # (often leaves nothing to do)
                    if not rest:
                        continue
                probe = block.probe(sched, v)
                probe_rule = ev.violation(probe)
                # With nothing pinned, only the probe's rules can fail (the options exclude sp
                # without TP and offload without ZeRO); with pins, each strategy is checked.
                if probe_rule is not None and not pinned:
                    note(probe_rule, len(rest))
                    continue
                if not pinned and states_overflow_all(ev, probe, rest, self._statics):
                    evaluated += len(rest)  # its stages' states alone overflow: nothing fits
                    continue
                optimist = options.optimistic(self.pins, self.consent, probe)
                if probe_rule is None and schedule_lower_bound_s(ev, optimist) > worst_s():
                    continue
                if probe_rule is None:  # the members of families slower than the K-th best
                    fast = self._families.fast_choices(block, sched, v, rest, worst_s())
                    evaluated += len(rest) - len(fast)  # need neither memory nor time
                    if not fast:
                        continue
                    rest = fast
                statics: list[tuple[float, ...] | None] = []
                totals = memory_totals(
                    ev,
                    probe,
                    rest,
                    fit_only=kept.full(),
                    statics=statics,
                    params_follow=block.params_follow,
                )
                fitted: list[tuple[bool, int, bool, int]] = []  # (sp, zero, offload, rc)
                deferred: dict[tuple[bool, int], Task] = {}  # per-layer solves by (sp, zero)
                cap, rescued = ev.capacity_bytes, options.RESCUED_RECOMPUTE
                unbuilt = not pinned and (runnable or not self.runnable_only)  # no `_gap` below
                for choice, total, static in zip(rest, totals, statics, strict=True):
                    sp, zero, off, rc = choice
                    if runnable and total is not None and total > cap and rc not in rescued:
                        evaluated += 1  # does not fit, nor is offload tried on it: it cannot
                        continue  # rank (the heap is full: its memory is not needed either)
                    full = kept.full()
                    if (
                        full
                        and unbuilt
                        and static_rejects(ev, self.pins, probe, choice, total, static)
                    ):
                        evaluated += 1  # what its stages hold decides: no need to build it
                        continue
                    s = block.strategy(sched, v, sp, zero, off, rc)
                    if pinned:
                        broken = ev.violation(s)
                        if broken is not None:
                            note(broken)
                            continue
                    evaluated += 1
                    if not runnable and full and self.runnable_only and self._gap(s):
                        # Neither it nor its offload rescues run (`_rescue_runs_only_if`): it
                        # cannot rank, so neither its per-layer solve nor its rescue is needed.
                        # With the heap full the search cannot end empty, so the error message
                        # that names an unrunnable strategy is not needed either.
                        continue
                    if total is None:  # per_layer: solve it only if it could make the top k
                        if full and states_overflow(ev, s):
                            continue  # no recompute policy fits it: no need to solve
                        if full and not self.consent.any:  # never faster than rc=none
                            plain = block.strategy(sched, v, sp, zero, off, Recompute.NONE)
                            if self._families.slower(plain, worst_s()):
                                continue
                            key = self._families.bound_s(plain)  # its own bound: in its turn
                            task = deferred.get((sp, zero))  # solved in its turn, with its
                            if task is None:  # (sp, zero) siblings in order
                                task = deferred[(sp, zero)] = Task(
                                    PER_LAYER, [], block, fitted, runnable, exact=False
                                )
                            if key < task.key:
                                task.key = key
                                heapq.heappush(queue, (key, next(order), task))
                            task.strategies.append(s)
                            task.bounded.append(plain)
                            continue
                        total = ev.memory(s)[0].total_bytes
                    if not full or total <= cap:
                        self._fitted(s, total, block, fitted, runnable, kept)
                        continue
                    if not self._rescuable(s):
                        continue  # no offload makes it fit: it cannot rank
                    self._note_memory(s, total)
                    if self._families.slower(s, worst_s()):
                        continue  # as would its rescues, which only add offload
                    key = self._families.bound_s(s)  # its own bound waits for its turn
                    key = max(key, self._families.rescue_floor_s(s))  # activation copies
                    if key > worst_s():
                        continue
                    task = Task(RESCUE, [s], block, fitted, runnable, key, exact=False)
                    task.bounded.append(s)
                    heapq.heappush(queue, (key, next(order), task))  # rescued in its turn
        if progress is not None:
            progress(1.0)
        found = kept.estimates()
        return Explored(found, evaluated, violations, examples, self._min_mem, self._unrunnable)

    def _finish(self, found: Explored) -> SearchResult:
        """The result of `run` from what its exploration found, or the error that says why
        nothing was found."""
        ev = self.ev
        if found.evaluated == 0 and not found.kept:
            violations, examples = found.violations, found.examples
            for s in self.configs():  # nothing was valid: say which rule blocks most of it
                broken = ev.violation(s)
                if broken is not None:
                    violations[broken.rule] += 1
                    examples.setdefault(broken.rule, broken)
            top = violations.most_common(1)[0][0] if violations else None
            why = "no candidates" if top is None else f"{examples[top]} (rule {top})"
            raise ValueError(
                f"no valid parallel configuration for {ev.profile.name} on "
                f"{ev.cluster.num_gpus} GPUs with {self.pins.describe() or 'nothing pinned'}: "
                f"{why}; change the pinned values"
            )
        if not found.kept and found.unrunnable is not None:
            raise ValueError(
                f"every plan that fits {ev.profile.name} on {ev.cluster.num_gpus} GPUs is one the "
                f"executor cannot run, e.g. {found.unrunnable}; plan with --any-engine to see "
                "the fastest of them anyway"
            )
        self._min_mem = found.min_mem
        least = None if found.min_mem is None else self._estimate(found.min_mem[1])
        if not found.kept:
            least = least_memory(ev, list(self.blocks()), least)
        ranked = tuple(sorted(found.kept, key=rank_key))
        return SearchResult(ranked=ranked, evaluated=found.evaluated, min_memory=least)

    def _cannot_fit(self, s: Strategy) -> bool:
        """Whether no per-layer solution of `s` fits (`PerLayerRecompute.cannot_fit`): it
        cannot rank, nor is it rescued, so its solve is not needed."""
        ev = self.ev
        return not has_options(s) and not ev.single_pass(s) and ev.per_layer.cannot_fit(s)

    def _note_memory(self, s: Strategy, total: float) -> None:
        """Remember `s` if it needs the least memory seen yet (and its host holds what it
        offloads: else the least memory would name a strategy no host runs)."""
        better = self._min_mem is None or total < self._min_mem[0]
        if better and options.fits_host(self.ev, s):
            self._min_mem = (total, s)

    def _rescuable(self, s: Strategy) -> bool:
        """Whether `_rescue` may offer anything for `s` (its cheap checks)."""
        return s.recompute in options.RESCUED_RECOMPUTE and options.rescuable(self.ev, s, self.pins)

    def _fitted(
        self,
        s: Strategy,
        total: float,
        block: Block,
        fitted: list[tuple[bool, int, bool, int]],
        runnable: bool,
        kept: Kept,
    ) -> None:
        """What follows the peak memory `total` of a strategy of `block`: its offload rescues
        when it does not fit; else, unless it only adds recompute or offload to a faster
        strategy of its schedule that fits (`fitted`), its variants and itself, in its best
        mesh order, if it could rank."""
        if s.offload_params and not options.fits_host(self.ev, s):
            return  # the host cannot hold its shards (its rescues neither: `_offer`)
        self._note_memory(s, total)
        if total > self.ev.capacity_bytes:  # offload may make it fit (options.py)
            self._rescue(s, kept)
            return
        if self.runnable_only and not runnable and self._gap(s):
            return  # fits, but the executor cannot run it
        rc_rank = RECOMPUTE_RANK[s.recompute]
        sp, zero, off, rc = s.sequence_parallel, s.zero_stage, s.offload_optimizer, s.recompute
        if any(
            f[0] == sp
            and f[1] == zero
            and f[2] <= off
            and f[3] <= rc_rank
            and (f[2] == off or self._offload_slower)
            and (rc != Recompute.PER_LAYER or f[3] == 0)
            and not block.base.offload_activations  # recompute cuts its PCIe
            for f in fitted
        ):
            return  # only adds recompute/offload to a faster strategy that fits
        fitted.append((sp, zero, off, rc_rank))
        self._offer(options.fit_variants(s, self.pins, self.consent), kept)
        if kept.full() and self._slower(s, kept.worst_s()):
            return
        memory, peak_stage = self.ev.memory(s)
        kept.push(best_order(self.ev, s, memory, peak_stage, self.space))

    def _task(self, task: Task, kept: Kept) -> None:
        """Deferred work (`run`), with the K-th best as it stands now."""
        if task.done:
            return  # queued twice, under a lower bound the second time
        task.done = True
        if task.kind == RESCUE:
            self._rescue(task.strategies[0], kept)
        else:  # per-layer solves of one (sp, zero), in the order the block lists them
            for s, plain in zip(task.strategies, task.bounded, strict=True):
                if self._slower(plain, kept.worst_s()) or self._cannot_fit(s):
                    continue
                if not has_options(s):  # its recompute bounded before it is solved
                    coll = self._families.coll(s)
                    known = self._plain_stages.get(plain)
                    if per_layer_lower_bound_s(self.ev, s, coll, plain, known) > kept.worst_s():
                        continue
                total = self.ev.memory(s)[0].total_bytes
                self._fitted(s, total, task.block, task.fitted, task.runnable, kept)

    def _rescue(self, s: Strategy, kept: Kept) -> bool:
        """Offer the offload variants of `s`, which does not fit (`options.rescues`), unless
        they cannot fit or rank (offload only adds time to `s`); whether one fitted. Only
        recompute none or full: offload in place of recomputing, or on top of the least
        memory recompute gives (selective lies between; per_layer solves without offload)."""
        ev = self.ev
        if s.recompute not in options.RESCUED_RECOMPUTE or not options.rescuable(ev, s, self.pins):
            return False
        if kept.full() and self._slower(s, kept.worst_s()):
            return False
        if kept.full() and self._families.rescue_floor_s(s) > kept.worst_s():
            return False  # none can rank: skip their memory
        tiers = options.rescues(s, self.pins)
        for i, tier in enumerate(tiers):
            if self._offer(tier, kept, need_fit=i < len(tiers) - 1):
                return True
        return False

    def _offer(self, variants: list[Strategy], kept: Kept, *, need_fit: bool = False) -> bool:
        """Evaluate option variants (`options.py`) and keep those that fit and rank; whether
        any fitted (whether or not it ranks) when `need_fit`; otherwise a variant slower than
        the K-th best is dropped before its memory is priced (the answer is then unused)."""
        fits = False
        for s in variants:
            if self.ev.violation(s) is not None or option_problem(s) is not None:
                continue
            if not need_fit and kept.full() and self._slower(s, kept.worst_s()):
                continue  # slower than the K-th best in any mesh order, fitting or not
            memory, peak_stage = self.ev.memory(s)
            if memory.total_bytes > self.ev.capacity_bytes:
                continue
            if not options.fits_host(self.ev, s):
                continue  # the host cannot hold what it offloads
            if self.runnable_only and self._gap(s):
                continue
            fits = True
            if kept.full() and self._slower(s, kept.worst_s()):
                continue  # fits, but slower than the K-th best in any mesh order
            kept.push(best_order(self.ev, s, memory, peak_stage, self.space))
        return fits

    def _slower(self, s: Strategy, worst_s: float) -> bool:
        """Whether `s` is slower than `worst_s` in every mesh order: its family's bound first
        (shared, cheap), then its own (`_time_lower_bound_s`)."""
        if self._families.slower(s, worst_s):
            return True
        return self._time_lower_bound_s(s) > worst_s

    def _time_lower_bound_s(self, s: Strategy) -> float:
        """A step time no mesh order of `s` beats: each collective at the least time of its
        group size's links over the mesh orders (`search_bounds.strategy_lower_bound_s`;
        memoized: the rescue and the per-layer bound ask for the same strategies)."""
        bound = self._lb_s.get(s)
        if bound is None:
            coll = self._families.coll(s)
            stages = bound_stage_times(self.ev, s, coll)
            if s.recompute == Recompute.NONE:  # a per-layer bound reads them again
                self._plain_stages[s] = stages
            bound = self._lb_s[s] = strategy_lower_bound_s(self.ev, s, coll, stages)
        return bound

    def _gap(self, s: Strategy) -> bool:
        """Whether the executor cannot run `s` (remembers one reason for the error)."""
        t = self.ev.train
        job = Job(
            strategy=s,
            experts=self.ev.profile.experts,
            dense_blocks=self._dense_blocks,
            precision=t.precision,
            optimizer=t.optimizer,
        )
        gaps = executor_gaps(job)
        if gaps and self._unrunnable is None:
            self._unrunnable = f"{s.short()}: {gaps[0]}"
        return bool(gaps)

    def _estimate(self, s: Strategy) -> Estimate:
        memory, stage = self.ev.memory(s)
        return self.ev.finish(s, memory, stage, self.ev.time(s))
