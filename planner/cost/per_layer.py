"""Per-layer recompute decisions of the evaluator's strategies (docs/cost-model.md §8.1).

For `Recompute.PER_LAYER` each distinct pipeline stage is solved by `cost/recompute.py` for its
activation budget; uniform policies map to the blocks directly. Memoized per evaluator.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from ..model import LayerKind
from ..strategy import Recompute, Strategy
from .layout import Stage, pipeline_chunks
from .memory import in_flight_microbatches, layer_act_bytes
from .recompute import LayerChoice, StageProblem, solve_stage

if TYPE_CHECKING:
    from .evaluate import Evaluator


class PerLayerRecompute:
    """The per-layer recompute policies of one evaluator's strategies."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev
        self._stage_copies = cache(self._stage_copies_uncached)
        self._solved = cache(self._solved_uncached)
        self.uniform = cache(self._uniform_uncached)
        self._layer_choices = cache(self._layer_choices_uncached)
        self._stage_rc = cache(self._stage_rc_uncached)
        self._solve_stage = cache(solve_stage)

    def policies(self, s: Strategy) -> tuple[Recompute, ...]:
        """The recompute policy of every chain layer: the strategy's uniform policy on the
        blocks, or, for `per_layer`, the stage solver's choice (`cost/recompute.py`)."""
        if s.recompute != Recompute.PER_LAYER:
            return self.uniform(s.recompute)
        return self._solved(_solver_key(s))

    def decisions(self, s: Strategy) -> tuple[tuple[Recompute, float, float], ...]:
        """Per chain layer: (policy, activation bytes kept per micro-batch on one rank,
        recompute seconds per micro-batch)."""
        ev = self.ev
        sums = ev._layer_times(s.tp, s.cp, s.ep, s.micro_batch_size)
        out = []
        for i, (x, policy) in enumerate(zip(ev.profile.layers, self.policies(s),
                                            strict=True)):  # fmt: skip
            kept = layer_act_bytes(x, tp=s.tp, sp=s.sequence_parallel, cp=s.cp, recompute=policy)
            k = {Recompute.FULL: 2, Recompute.SELECTIVE: 3}.get(policy)
            seconds = sums[k][i + 1] - sums[k][i] if k else 0.0
            out.append((policy, kept * ev.act_scale * s.micro_batch_size, seconds))
        return tuple(out)

    def _uniform_uncached(self, rc: Recompute) -> tuple[Recompute, ...]:
        return tuple(rc if x.kind == LayerKind.BLOCK else Recompute.NONE
                     for x in self.ev.profile.layers)  # fmt: skip

    def _solved_uncached(self, key: tuple) -> tuple[Recompute, ...]:
        """Per-layer policies of a `per_layer` strategy. Each distinct stage is solved for its
        budget (capacity less static memory and pipeline buffers) with its in-flight
        micro-batches; stages that look alike copy the first one's choice, which holds the
        most micro-batches, so they fit too and take no longer. A stage nothing fits takes the
        least-memory uniform policy."""
        ev = self.ev
        s = _strategy_of(key)
        p, mbs, v = ev.profile, s.micro_batch_size, s.virtual_stages
        choice, kept_none, tmp = self._layer_choices(s.tp, s.sequence_parallel, s.cp, s.ep, mbs)
        boundary = 2 * v * ev._boundary_bytes(s) if s.pp > 1 else 0.0
        m = ev.num_microbatches(s)
        solved: list[tuple[Recompute, ...]] = []
        for stage in ev._stages(s.pp, v):
            static = sum(ev._static_memory(stage, s.tp, s.ep, s.dp * s.cp, s.zero_stage,
                                           s.offload_optimizer))  # fmt: skip
            layers = stage.layers
            problem = StageProblem(
                choices=tuple(choice[i] for i in layers),
                fixed_bytes=sum(kept_none[i] for i in layers if choice[i] is None),
                inflight=in_flight_microbatches(s.schedule, pp=s.pp, stage=stage.index,
                                                num_microbatches=m, virtual_stages=v),
                transient_bytes=max(tmp[i] for i in layers),
                head_bytes=kept_none[-1] if stage.has_head else 0.0,
                budget_bytes=(ev.capacity_bytes - static - boundary) / mbs,
            )  # fmt: skip
            picks = self._solve_stage(problem)
            if picks is None:
                uniform = [tuple(r if c is not None else Recompute.NONE for c in problem.choices)
                           for r in (Recompute.FULL, Recompute.SELECTIVE)]  # fmt: skip
                picks = min(uniform, key=problem.bytes_of)
            solved.append(picks)
        out = [Recompute.NONE] * len(p.layers)
        for idx, rep in self._stage_copies(s.pp, v):
            for i, pick in zip(idx, solved[rep], strict=True):
                out[i] = pick
        return tuple(out)

    def _layer_choices_uncached(
        self, tp: int, sp: bool, cp: int, ep: int, mbs: int
    ) -> tuple[tuple[LayerChoice | None, ...], tuple[float, ...], tuple[float, ...]]:
        """Per chain layer: the recompute solver's options (None: never recomputes), the bytes
        kept per sequence without recompute, the transient peak per sequence."""
        ev = self.ev
        p, k = ev.profile, ev.act_scale
        sums = ev._layer_times(tp, cp, ep, mbs)
        choice: list[LayerChoice | None] = []
        kept_none: list[float] = []
        tmp: list[float] = []
        first: dict[tuple, int] = {}  # identical layers get the identical choice (same times)
        for j in range(len(p.layers)):
            i = first.setdefault(ev._layer_keys[j], j)
            x = p.layers[i]
            acts = [layer_act_bytes(x, tp=tp, sp=sp, cp=cp, recompute=r) * k
                    for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)]  # fmt: skip
            kept_none.append(acts[0])
            tmp.append(max(x.fwd_tmp_bytes, x.bwd_tmp_bytes) * k / (tp * cp))
            if x.kind != LayerKind.BLOCK:
                choice.append(None)
            elif i < j:
                choice.append(choice[i])
            else:
                choice.append(LayerChoice(
                    none_bytes=acts[0], selective_bytes=acts[1], full_bytes=acts[2],
                    selective_s=sums[3][i + 1] - sums[3][i], full_s=sums[2][i + 1] - sums[2][i],
                    back_bytes=acts[0] - acts[2],
                ))  # fmt: skip
        return tuple(choice), tuple(kept_none), tuple(tmp)

    def _stage_copies_uncached(self, pp: int, v: int) -> tuple[tuple[tuple[int, ...], int], ...]:
        """For every pipeline stage: its chain layers and the position in `_stages(pp, v)` of
        the stage it looks exactly like."""
        ev = self.ev
        p = ev.profile
        chunks = pipeline_chunks(p, pp, v)
        reps: dict[tuple, int] = {}
        out = []
        for st in range(pp):
            idx = tuple(
                i for c in chunks if c.stage == st for i in range(c.first_layer, c.last_layer + 1)
            )
            signature = (tuple(ev._layer_keys[i] for i in idx), st == 0, st == pp - 1)
            reps.setdefault(signature, len(reps))
            out.append((idx, reps[signature]))
        return tuple(out)

    def stage_recompute(
        self, s: Strategy, stage: Stage, compute: tuple[float, float, float, float]
    ) -> tuple[float, int, int]:
        """(recompute seconds per micro-batch, fully recomputed blocks, of which MoE) of a
        stage under the strategy's policy; `compute` is the stage's (forward, backward,
        full-recompute, selective-recompute) seconds per micro-batch."""
        _, _, rc_full, rc_sel = compute
        if s.recompute == Recompute.FULL:
            return rc_full, stage.n_blocks, stage.n_moe_blocks
        if s.recompute == Recompute.SELECTIVE:
            return rc_sel, 0, 0
        if s.recompute == Recompute.NONE:
            return 0.0, 0, 0
        return self._stage_rc(_solver_key(s), stage)

    def _stage_rc_uncached(self, key: tuple, stage: Stage) -> tuple[float, int, int]:
        ev = self.ev
        s = _strategy_of(key)
        policies = self.policies(s)
        sums = ev._layer_times(s.tp, s.cp, s.ep, s.micro_batch_size)
        seconds, n_full, n_full_moe = 0.0, 0, 0
        for i in stage.layers:
            if policies[i] == Recompute.FULL:
                seconds += sums[2][i + 1] - sums[2][i]
                n_full += 1
                n_full_moe += int(bool(ev.profile.layers[i].expert_params))
            elif policies[i] == Recompute.SELECTIVE:
                seconds += sums[3][i + 1] - sums[3][i]
        return seconds, n_full, n_full_moe


def _solver_key(s: Strategy) -> tuple:
    """What the per-layer solution depends on: the strategy without its mesh order."""
    return (s.dp, s.tp, s.pp, s.cp, s.ep, s.zero_stage, s.offload_optimizer,
            s.sequence_parallel, s.schedule, s.virtual_stages, s.micro_batch_size)  # fmt: skip


def _strategy_of(key: tuple) -> Strategy:
    dp, tp, pp, cp, ep, zero, off, sp, schedule, v, mbs = key
    return Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=zero, offload_optimizer=off,
                    sequence_parallel=sp, schedule=schedule, virtual_stages=v,
                    micro_batch_size=mbs, recompute=Recompute.PER_LAYER)  # fmt: skip
