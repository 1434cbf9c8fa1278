"""Per-layer recompute decisions of the evaluator's strategies (docs/cost-model.md §8.1).

For `Recompute.PER_LAYER` each distinct pipeline stage is solved by `cost/recompute.py` for its
activation budget; uniform policies map to the blocks directly. Memoized per evaluator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache

from ..model import LayerKind
from ..strategy import DEFAULT_MESH_ORDER, Recompute, Strategy
from .float8 import layer_kept_bytes
from .layout import Stage
from .memo import memo_method
from .memory import head_in_flight, in_flight_microbatches, layer_tmp_bytes, step_tmp_bytes
from .mixed_precision import (
    autocast_layer_bytes,
    autocast_memory,
    autocasts,
    cached_weight_bytes,
    weights_cached,
)
from .recompute import (
    LayerChoice,
    Relaxation,
    StageProblem,
    least_recompute_s,
    relaxation,
    relaxation_fits,
    solve_stage,
)
from .recompute_pattern import RecomputePattern
from .stages import StageCompute, StageModel


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageParts:
    """What a stage's `StageProblem` takes of its layers, whatever the ZeRO stage, offload and
    pipeline schedule (`PerLayerRecompute._stage_parts`)."""

    stage: Stage
    """The stage (kept alive: its id keys the memo)."""
    choices: tuple[LayerChoice | None, ...]
    """`StageProblem.choices`."""
    fixed_bytes: float
    """`StageProblem.fixed_bytes`."""
    transient_bytes: float
    """`StageProblem.transient_bytes`."""
    head_bytes: float
    """`StageProblem.head_bytes`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRecompute:
    """What one stage recomputes per micro-batch (`PerLayerRecompute.stage_recompute`)."""

    seconds: float = 0.0
    """Forward seconds redone in backward."""
    full_blocks: int = 0
    """Blocks recomputed whole (their TP collectives run again)."""
    full_moe_blocks: int = 0
    """Of those, blocks with experts (their all-to-alls run again)."""
    selective_moe_blocks: int = 0
    """Blocks with experts under selective recompute (under Megatron-Core's `moe` module their
    MoE layer, all-to-alls included, runs again)."""


class PerLayerRecompute:
    """The per-layer recompute policies of one evaluator's strategies."""

    def __init__(self, stage_model: StageModel, pattern: RecomputePattern | None = None) -> None:
        self.sm = stage_model
        self.pattern = pattern
        """A trainer configuration's own blocks to recompute, priced for `per_layer` in place of
        the solver's choice (`recompute_pattern.py`); None: solved."""
        self._solved = memo_method(self, PerLayerRecompute._solved_uncached)
        self._layer_choices = memo_method(self, PerLayerRecompute._layer_choices_uncached)
        self._stage_rc = memo_method(self, PerLayerRecompute._stage_rc_uncached)
        self._solve_stage = cache(solve_stage)
        self._problem_memo: dict[Strategy, tuple[StageProblem, ...]] = {}  # `problems`
        self._relaxations: dict[tuple[int, ...], tuple[tuple, Relaxation]] = {}
        self._relaxation_of: dict[int, tuple[tuple, Relaxation]] = {}  # by id of the tuple
        self._parts: dict[tuple, _StageParts] = {}  # `_stage_parts`, by the stage's id
        self._static_bytes: dict[tuple, float] = {}  # static memory, by the stage's id
        self._inflight: dict[tuple, float] = {}  # `in_flight_microbatches`

    def policies(self, s: Strategy) -> tuple[Recompute, ...]:
        """The recompute policy of every chain layer: the strategy's uniform policy on the
        blocks, or, for `per_layer`, the stage solver's choice (`cost/recompute.py`)."""
        if s.recompute != Recompute.PER_LAYER:
            return self.sm.uniform(s.recompute)
        return self._solved(_solver_key(s))

    def decisions(self, s: Strategy) -> tuple[tuple[Recompute, float, float], ...]:
        """Per chain layer: (policy, activation bytes kept per micro-batch on one rank,
        recompute seconds per micro-batch)."""
        sm = self.sm
        times = sm.layer_times(s.tp, s.cp, s.ep_dp, s.micro_batch_size)
        out = []
        for i, (x, policy) in enumerate(zip(sm.profile.layers, self.policies(s), strict=True)):
            kept = layer_kept_bytes(
                sm.fp8,
                sm.profile,
                x,
                tp=s.tp,
                sp=s.sequence_parallel,
                cp=s.cp,
                recompute=policy,
                runtime=sm.train.runtime,
            )
            out.append(
                (
                    policy,
                    kept * sm.act_scale * s.micro_batch_size,
                    _recompute_s(times.layer(i), policy),
                )
            )
        return tuple(out)

    def _solved_uncached(self, key: Strategy) -> tuple[Recompute, ...]:
        """Per-layer policies of a `per_layer` strategy (the pattern's, when given). Each
        distinct stage is solved for its budget (capacity less static memory and pipeline
        buffers) with its in-flight micro-batches; stages that look alike copy the first one's
        choice, which holds the most micro-batches, so they fit too and take no longer. A
        stage nothing fits takes the least-memory uniform policy."""
        sm = self.sm
        if self.pattern is not None:  # the trainer's own choice, as it runs it
            return self.pattern.policies(sm.profile, sm.chunks(sm.layout_of(key)))
        solved: list[tuple[Recompute, ...]] = []
        for problem in self.problems(key):
            picks = self._solve_stage(problem)
            if picks is None:
                uniform = [
                    tuple(r if c is not None else Recompute.NONE for c in problem.choices)
                    for r in (Recompute.FULL, Recompute.SELECTIVE)
                ]
                picks = min(uniform, key=problem.bytes_of)
            solved.append(picks)
        out = [Recompute.NONE] * len(sm.profile.layers)
        for idx, rep in sm.stage_copies(sm.layout_of(key)):
            for i, pick in zip(idx, solved[rep], strict=True):
                out[i] = pick
        return tuple(out)

    def problems(self, s: Strategy) -> tuple[StageProblem, ...]:
        """The recompute problem of each distinct stage of `s` (`StageModel.stages` of its
        layout), as `policies` solves them (memoized: the search bounds them first)."""
        key = _solver_key(s)
        found = self._problem_memo.get(key)
        if found is None:
            found = self._problem_memo[key] = tuple(self._stage_problems(key))
        return found

    def _stage_problems(self, s: Strategy) -> Iterator[StageProblem]:
        """`problems`, one stage at a time (`cannot_fit` may stop at the first)."""
        sm = self.sm
        mbs, v = s.micro_batch_size, s.virtual_stages
        tp, ep, dpcp, replicate = s.tp, s.ep_dp, s.dp * s.cp, s.dp_replicate
        zero, off = s.zero_stage, s.offload_optimizer
        boundary = 2 * v * sm.boundary_bytes(s) if s.pp > 1 else 0.0
        m = sm.num_microbatches(s)
        cast = autocasts(s) and autocast_memory(s, sm)  # autocast's held bytes count too
        cached = cast and weights_cached(s)  # the weights' casts held once, not per micro-batch
        for stage in sm.stages(sm.layout_of(s)):
            # Stage objects live as long as the model (`StageLayouts`): their ids key the memos
            key = (id(stage), tp, ep, dpcp, zero, off, replicate)
            static = self._static_bytes.get(key)
            if static is None:
                static = self._static_bytes[key] = sm.static_memory(
                    stage, tp, ep, dpcp, zero, off, replicate
                ).total_bytes
            parts = self._stage_parts(stage, tp, s.sequence_parallel, s.cp, ep, mbs, cast, cached)
            held = cached_weight_bytes(s, stage.layers, sm.profile, sm.act_scale) if cached else 0.0
            where = (s.schedule, s.pp, stage.index, m, v)
            inflight = self._inflight.get(where)
            if inflight is None:
                inflight = self._inflight[where] = in_flight_microbatches(
                    s.schedule, pp=s.pp, stage=stage.index, num_microbatches=m, virtual_stages=v
                )
            # the head's kept bytes for the micro-batches the stage holds it for, in units of
            # the stage's in-flight count (`memory.head_in_flight`)
            head_share = head_in_flight(s.schedule, inflight) / inflight if inflight else 1.0
            yield StageProblem(
                choices=parts.choices,
                fixed_bytes=parts.fixed_bytes - parts.head_bytes * (1.0 - head_share),
                inflight=inflight,
                transient_bytes=parts.transient_bytes,
                head_bytes=parts.head_bytes,
                budget_bytes=(sm.capacity_bytes - static - boundary - held) / mbs,
            )

    def _stage_parts(
        self,
        stage: Stage,
        tp: int,
        sp: bool,
        cp: int,
        ep: int,
        mbs: int,
        cast: bool,
        cached: bool,
    ) -> _StageParts:
        """What a stage's `StageProblem` takes of its layers (memoized by the stage's id; the
        memo keeps the stage alive, so its id is not reused)."""
        key = (id(stage), tp, sp, cp, ep, mbs, cast, cached)
        found = self._parts.get(key)
        if found is None:
            choice, kept_none, tmp = self._layer_choices(tp, sp, cp, ep, mbs, cast, cached)
            layers = stage.layers
            found = self._parts[key] = _StageParts(
                stage=stage,
                choices=tuple(choice[i] for i in layers),
                fixed_bytes=sum(kept_none[i] for i in layers if choice[i] is None),
                transient_bytes=max(tmp[i] for i in layers),
                head_bytes=kept_none[-1] if stage.has_head else 0.0,
            )
        return found

    def recompute_lower_bounds_s(self, s: Strategy) -> tuple[float, ...]:
        """Per distinct stage of a `per_layer` strategy, a bound on the recompute seconds per
        micro-batch its solution adds, without solving (`recompute.least_recompute_s`)."""
        return tuple(
            least_recompute_s(problem, self._relaxation(problem.choices))
            for problem in self.problems(s)
        )

    def cannot_fit(self, s: Strategy) -> bool:
        """Whether some distinct stage of a `per_layer` strategy holds more activations than
        its budget whatever its blocks recompute (`recompute.relaxation_fits` false): the
        solver then finds nothing there, the stage takes the least-memory uniform policy, which
        does not fit either, and so neither does the strategy. For strategies without options
        whose memory is each stage's peak (not `Evaluator.single_pass`'s timeline)."""
        key = _solver_key(s)
        known = self._problem_memo.get(key)
        built = []
        for problem in known or self._stage_problems(key):  # the first over budget decides
            if not relaxation_fits(problem, self._relaxation(problem.choices)):
                return True  # nothing to solve: built problems are not kept
            built.append(problem)
        self._problem_memo[key] = tuple(built)
        return False

    def _relaxation(self, choices: tuple[LayerChoice | None, ...]) -> Relaxation:
        """`recompute.relaxation` of a stage's choices, memoized by the identity of its
        `LayerChoice` objects (kept alive here: their ids are not reused), and first by the
        identity of the tuple itself (`_stage_parts` hands out one per stage shape)."""
        known = self._relaxation_of.get(id(choices))
        if known is not None:
            return known[1]
        key = tuple(map(id, choices))
        found = self._relaxations.get(key)
        if found is None:
            found = self._relaxations[key] = (choices, relaxation(choices))
        self._relaxation_of[id(choices)] = (choices, found[1])  # keeps `choices` alive
        return found[1]

    def _layer_choices_uncached(
        self, tp: int, sp: bool, cp: int, ep: int, mbs: int, cast: bool, cached: bool
    ) -> tuple[tuple[LayerChoice | None, ...], tuple[float, ...], tuple[float, ...]]:
        """Per chain layer: the recompute solver's options (None: never recomputes), the bytes
        kept per sequence without recompute, the transient peak per sequence; with `cast`,
        what autocast holds beside (`mixed_precision.autocast_layer_bytes`; the weights'
        copies left out when `cached`: the stage's budget holds them)."""
        sm = self.sm
        p, k = sm.profile, sm.act_scale
        times = sm.layer_times(tp, cp, ep, mbs)
        choice: list[LayerChoice | None] = []
        kept_none: list[float] = []
        tmp: list[float] = []
        first: dict[tuple, int] = {}  # identical layers get the identical choice (same times)
        runtime, loss = sm.train.runtime, sm.train.runtime.torch_loss
        for j in range(len(p.layers)):
            i = first.setdefault(sm.layer_keys[j], j)
            x = p.layers[i]
            acts = [
                layer_kept_bytes(sm.fp8, p, x, tp=tp, sp=sp, cp=cp, recompute=r, runtime=runtime)
                * k
                + (
                    autocast_layer_bytes(
                        p, x, k, r, tp=tp, sp=sp, cp=cp, ep=ep, mbs=mbs, cached=cached
                    )
                    if cast
                    else 0
                )
                for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
            ]
            kept_none.append(acts[0])
            # the embedding's weight-sized transient, per sequence at this micro-batch
            step = step_tmp_bytes(x, act_scale=k, tp=tp) / mbs
            tmp.append(max(step, layer_tmp_bytes(x, p, act_scale=k, tp=tp, cp=cp, torch_loss=loss)))
            if x.kind != LayerKind.BLOCK:
                choice.append(None)
            elif i < j:
                choice.append(choice[i])
            else:
                choice.append(
                    LayerChoice(
                        none_bytes=acts[0],
                        selective_bytes=acts[1],
                        full_bytes=acts[2],
                        selective_s=times.layer(i).selective_recompute_s,
                        full_s=times.layer(i).full_recompute_s,
                        back_bytes=acts[0] - acts[2],
                    )
                )
        return tuple(choice), tuple(kept_none), tuple(tmp)

    def stage_recompute(self, s: Strategy, stage: Stage, compute: StageCompute) -> StageRecompute:
        """What a stage recomputes per micro-batch under the strategy's policy; `compute` is
        the stage's seconds per micro-batch."""
        if s.recompute == Recompute.FULL:
            return StageRecompute(
                seconds=compute.full_recompute_s,
                full_blocks=stage.n_blocks,
                full_moe_blocks=stage.n_moe_blocks,
            )
        if s.recompute == Recompute.SELECTIVE:
            return StageRecompute(
                seconds=compute.selective_recompute_s, selective_moe_blocks=stage.n_moe_blocks
            )
        if s.recompute == Recompute.NONE:
            return StageRecompute()
        return self._stage_rc(_solver_key(s), stage)

    def _stage_rc_uncached(self, key: Strategy, stage: Stage) -> StageRecompute:
        sm = self.sm
        s = key
        policies = self.policies(s)
        times = sm.layer_times(s.tp, s.cp, s.ep_dp, s.micro_batch_size)
        seconds, n_full, n_full_moe, n_sel_moe = 0.0, 0, 0, 0
        full_s, selective_s = times.full_recompute_s, times.selective_recompute_s
        for i in stage.layers:
            # `_recompute_s(times.layer(i), policies[i])`, without building the span
            moe = int(bool(sm.profile.layers[i].expert_params))
            if policies[i] == Recompute.FULL:
                seconds += full_s[i + 1] - full_s[i]
                n_full += 1
                n_full_moe += moe
            elif policies[i] == Recompute.SELECTIVE:
                seconds += selective_s[i + 1] - selective_s[i]
                n_sel_moe += moe
        return StageRecompute(
            seconds=seconds,
            full_blocks=n_full,
            full_moe_blocks=n_full_moe,
            selective_moe_blocks=n_sel_moe,
        )


def _recompute_s(c: StageCompute, policy: Recompute) -> float:
    """Seconds per micro-batch a layer's policy adds in backward."""
    if policy == Recompute.FULL:
        return c.full_recompute_s
    if policy == Recompute.SELECTIVE:
        return c.selective_recompute_s
    return 0.0


def _solver_key(s: Strategy) -> Strategy:
    """What the per-layer solution depends on: the strategy without its mesh order."""
    if s.mesh_order == DEFAULT_MESH_ORDER and s.recompute == Recompute.PER_LAYER:
        return s  # already the key (`replace` would build an equal copy)
    return replace(s, mesh_order=DEFAULT_MESH_ORDER, recompute=Recompute.PER_LAYER)
