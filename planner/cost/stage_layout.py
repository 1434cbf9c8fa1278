"""Which chain layers each pipeline stage runs under a layout: the chunks, the distinct stages
and which stage each rank copies (`StageModel` reads them; `layout.py` holds the types and the
cost-balanced split).

Memoized per layout. The cut of the blocks depends only on the chunk count and what weighs a
block (recompute, TP degree, sequence parallelism), so layouts that differ in placement alone
(a loop or a V, split backward or not, pp x v with the same product) share it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..model import LayerKind, ModelProfile
from ..solvers.pipeline_replay import SPLIT_BACKWARD, V_SHAPED
from ..strategy import Recompute, Schedule
from .count_split import CountSplit
from .layout import (
    BalancedCuts,
    Chunk,
    Layout,
    Stage,
    StageSplit,
    block_counts,
    chunks_from_counts,
)
from .memo import memo_method


class StageLayouts:
    """Chunks and stages of one model's layouts."""

    def __init__(
        self,
        profile: ModelProfile,
        split: StageSplit | CountSplit,
        layer_keys: tuple[tuple, ...],
        unit_costs_s: Callable[[Layout], list[float]],
    ) -> None:
        self.profile = profile
        self.split = split
        """How blocks are split over the pipeline chunks."""
        first: dict[tuple, int] = {}
        self.layer_class: tuple[int, ...] = tuple(
            first.setdefault(key, i) for i, key in enumerate(layer_keys)
        )
        """Per chain layer, the first layer that costs the same (equal `layer_keys`)."""
        self.unit_costs_s = unit_costs_s
        """Seconds per sequence of each block under a layout (what the split balances): it
        reads the layout's recompute, TP degree and sequence parallelism only."""
        self.chunks = memo_method(self, StageLayouts._chunks)
        self.stages = memo_method(self, StageLayouts._stages)
        self.stage_copies = memo_method(self, StageLayouts._stage_copies)
        self._cuts: dict[tuple, list[int]] = {}
        self._costs: dict[tuple, BalancedCuts] = {}  # by (recompute, tp, sequence parallel)
        self._placed: dict[tuple, tuple[tuple[Chunk, ...], list[_Placed]]] = {}
        self._stage: dict[tuple, Stage] = {}
        self._layouts: dict[tuple, Layout] = {}  # `layout`'s
        self._merged: dict[Layout, Layout] = {}  # `merged`'s
        layers = profile.layers
        blocks = [x.kind == LayerKind.BLOCK for x in layers]
        # prefix sums over the chain (of ints: a range's sum is exact, as `sum` over it)
        self._params = _prefix(x.params for x in layers)
        self._expert = _prefix(x.expert_params for x in layers)
        self._tensors = _prefix(x.param_tensors for x in layers)
        self._blocks = _prefix(int(b) for b in blocks)
        self._moe = _prefix(
            int(b and bool(x.expert_params)) for x, b in zip(layers, blocks, strict=True)
        )
        self._heads = _prefix(int(x.kind == LayerKind.HEAD) for x in layers)
        self._embeddings = _prefix(int(x.kind == LayerKind.EMBEDDING) for x in layers)
        # per layer, its parameters if a block, else 0 (a stage's largest block: 0 without)
        self._block_params = [x.params if b else 0 for x, b in zip(layers, blocks, strict=True)]
        self._block_expert = [
            x.expert_params if b else 0 for x, b in zip(layers, blocks, strict=True)
        ]

    def layout(
        self, pp: int, v: int, recompute: Recompute, tp: int, sp: bool, schedule: Schedule | None
    ) -> Layout:
        """The layout of a pp x v pipeline (blocks weighed under `recompute`, none for per-layer
        policies) under `schedule`: chunks in a V for ZB-V and DualPipeV, every stage kept under
        a split backward; one for every pp = 1. Memoized: one object per layout, which the memos
        keyed by layouts then find by identity."""
        key = (pp, v, recompute, tp, sp, schedule)
        found = self._layouts.get(key)
        if found is None:
            if pp == 1:
                found = Layout(1, 1, Recompute.NONE, 1, False)
            else:
                v_shaped, split = schedule in V_SHAPED, schedule in SPLIT_BACKWARD
                found = Layout(pp, v, recompute, tp, sp, v_shaped, split)
            self._layouts[key] = found
        return found

    def merged(self, lay: Layout) -> Layout:
        """`lay` without `Layout.per_stage` (a split backward's stages that look alike once:
        the bounds'), memoized; `lay` itself when it keeps only distinct stages."""
        if not lay.per_stage:
            return lay
        found = self._merged.get(lay)
        if found is None:
            found = self._merged[lay] = replace(lay, per_stage=False)
        return found

    def _placement(self, lay: Layout) -> tuple:
        """What a layout's chunks depend on: blocks per chunk, stages, V or loop."""
        n = lay.pp * lay.virtual_stages
        blocks, mtp = self.profile.decoder_blocks, self.profile.mtp_blocks
        if isinstance(self.split, CountSplit) and lay.pp > 1:
            counts = self.split.counts(blocks, lay.pp, lay.virtual_stages, mtp=mtp)
        elif self.split == StageSplit.EVEN or lay.pp == 1:
            counts = _last_plus(block_counts(blocks, n), mtp)
        else:
            key = (n, lay.recompute, lay.tp, lay.sequence_parallel)
            counts = self._cuts.get(key)  # type: ignore[assignment]
            if counts is None:
                weights = key[1:]  # what `unit_costs_s` reads of the layout
                table = self._costs.get(weights)
                if table is None:
                    table = self._costs[weights] = BalancedCuts(
                        _with_head(self.unit_costs_s(lay), mtp)
                    )
                counts = self._cuts[key] = _last_plus(table.cuts(n), mtp - 1 if mtp else 0)
        return (tuple(counts), lay.pp, lay.v_shaped)

    def _placed_of(self, lay: Layout) -> tuple[tuple, tuple[tuple[Chunk, ...], list[_Placed]]]:
        """The layout's placement key, its chunks and each stage's chunks and chain layers
        (shared by the layouts with the same placement)."""
        key = self._placement(lay)
        found = self._placed.get(key)
        if found is None:
            counts, pp, v_shaped = key
            chunks = chunks_from_counts(counts, pp, v_shaped=v_shaped)
            by_stage: list[list[Chunk]] = [[] for _ in range(pp)]
            for c in chunks:  # model order within each stage
                by_stage[c.stage].append(c)
            per_stage: list[_Placed] = []
            for mine in by_stage:
                spans = tuple((c.first_layer, c.last_layer + 1) for c in mine)
                idx = tuple(i for a, b in spans for i in range(a, b))
                classes = tuple(self.layer_class[i] for i in idx)
                per_stage.append((tuple(mine), spans, idx, classes))
            found = self._placed[key] = (chunks, per_stage)
        return key, found

    def _chunks(self, lay: Layout) -> tuple[Chunk, ...]:
        """Chunks in model order, cut by `balanced_cuts` (`BalancedCuts`) on the blocks'
        seconds under the layout (or evenly)."""
        return self._placed_of(lay)[1][0]

    def _signature(self, classes: tuple[int, ...], st: int, lay: Layout) -> tuple:
        """What makes two stages of a layout cost the same: their layers' costs, whether
        first or last, and under a split backward their index (`Layout.per_stage`)."""
        tag = st if lay.per_stage else -1
        return (classes, st == 0, st == lay.pp - 1, tag)

    def _stages(self, lay: Layout) -> tuple[Stage, ...]:
        """The distinct stages of a pp x v layout. Stages with identical layers and position
        (first/middle/last) cost the same, and in-flight micro-batches never grow with the
        stage index but under a split backward (`Layout.per_stage`), so only the first is kept."""
        key, (_, per_stage) = self._placed_of(lay)
        stages: list[Stage] = []
        seen: set[tuple] = set()
        for st, (mine, spans, idx, classes) in enumerate(per_stage):
            if not lay.per_stage:  # else every stage is kept
                signature = self._signature(classes, st, lay)
                if signature in seen:
                    continue
                seen.add(signature)
            stage = self._stage.get((key, st))
            if stage is None:
                stage = self._stage[(key, st)] = self._build(st, mine, spans, idx)
            stages.append(stage)
        return tuple(stages)

    def _build(
        self,
        st: int,
        mine: tuple[Chunk, ...],
        spans: tuple[tuple[int, int], ...],
        idx: tuple[int, ...],
    ) -> Stage:
        """Stage `st` of chunks `mine` (chain ranges `spans`, layers `idx`)."""
        p = self.profile

        def total(prefix: list[int]) -> int:
            return sum(prefix[b] - prefix[a] for a, b in spans)

        has_head = total(self._heads) > 0
        has_emb = total(self._embeddings) > 0
        dense = float(total(self._params))
        if has_head and p.tied_embeddings and not has_emb:
            dense += p.vocab * p.hidden  # the tied embedding's copy on the last stage
        return Stage(
            index=st,
            layers=idx,
            dense_params=dense,
            expert_params=float(total(self._expert)),
            max_block_params=float(max(max(self._block_params[a:b]) for a, b in spans)),
            max_block_expert_params=float(max(max(self._block_expert[a:b]) for a, b in spans)),
            n_blocks=total(self._blocks),
            n_moe_blocks=total(self._moe),
            has_embedding=has_emb,
            has_head=has_head,
            chunks=mine,
            param_tensors=total(self._tensors),
        )

    def _stage_copies(self, lay: Layout) -> tuple[tuple[tuple[int, ...], int], ...]:
        """For every pipeline stage: its chain layers and the position in `stages(lay)` of
        the stage it looks exactly like."""
        reps: dict[tuple, int] = {}
        out = []
        for st, (_, _, idx, classes) in enumerate(self._placed_of(lay)[1][1]):
            signature = self._signature(classes, st, lay)
            reps.setdefault(signature, len(reps))
            out.append((idx, reps[signature]))
        return tuple(out)


_Placed = tuple[tuple[Chunk, ...], tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]
"""One stage of a placement: its chunks, their [first, stop) chain ranges, its chain layers and
their cost classes (`StageLayouts.layer_class`)."""


def _last_plus(counts: list[int], mtp: int) -> list[int]:
    """`counts` with the `mtp` multi-token-prediction modules in the last chunk, beside the
    head (`planner/mtp.py`)."""
    return [*counts[:-1], counts[-1] + mtp] if mtp else counts


def _with_head(costs: list[float], mtp: int) -> list[float]:
    """Block costs with the last `mtp` (multi-token-prediction modules, which Megatron-Core
    places with the loss on the last stage) made one unit with the head, whose cost the last
    block's already carries: the split balances the decoder's blocks around it, and may give
    it a chunk of its own (Megatron-Bridge's DeepSeek-V3 layout `...|mL`)."""
    if not mtp:
        return costs
    return [*costs[:-mtp], sum(costs[-mtp:])]


def _prefix(values: Iterable[int]) -> list[int]:
    """Prefix sums: entry i is the sum of the first i values."""
    return [0, *itertools.accumulate(values)]
