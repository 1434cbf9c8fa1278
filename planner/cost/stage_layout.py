"""Which chain layers each pipeline stage runs under a layout: the chunks, the distinct stages
and which stage each rank copies (`StageModel` reads them; `layout.py` holds the types and the
cost-balanced split).

Memoized per layout. The cut of the blocks depends only on the chunk count and what weighs a
block (recompute, TP degree, sequence parallelism), so layouts that differ in placement alone
(a loop or a V, split backward or not, pp x v with the same product) share it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ..model import LayerKind, ModelProfile
from .layout import (
    Chunk,
    Layout,
    Stage,
    StageSplit,
    balanced_cuts,
    block_counts,
    chunks_from_counts,
)


class StageLayouts:
    """Chunks and stages of one model's layouts."""

    def __init__(
        self,
        profile: ModelProfile,
        split: StageSplit,
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
        """Seconds per sequence of each block under a layout (what the split balances)."""
        self.chunks = cache(self._chunks)
        self.stages = cache(self._stages)
        self.stage_copies = cache(self._stage_copies)
        self._cuts: dict[tuple, list[int]] = {}

    def _chunks(self, lay: Layout) -> tuple[Chunk, ...]:
        """Chunks in model order, cut by `balanced_cuts` on the blocks' seconds under the
        layout (or evenly)."""
        n = lay.pp * lay.virtual_stages
        v = lay.v_shaped
        if self.split == StageSplit.EVEN or lay.pp == 1:
            return chunks_from_counts(block_counts(self.profile.num_blocks, n), lay.pp, v_shaped=v)
        key = (n, lay.recompute, lay.tp, lay.sequence_parallel)
        cuts = self._cuts.get(key)
        if cuts is None:
            cuts = self._cuts[key] = balanced_cuts(self.unit_costs_s(lay), n)
        return chunks_from_counts(cuts, lay.pp, v_shaped=v)

    def _signature(self, idx: tuple[int, ...], st: int, lay: Layout) -> tuple:
        """What makes two stages of a layout cost the same: their layers' costs, whether
        first or last, and under a split backward their index (`Layout.per_stage`)."""
        tag = st if lay.per_stage else -1
        return (tuple(self.layer_class[i] for i in idx), st == 0, st == lay.pp - 1, tag)

    def _stage_layers(self, lay: Layout) -> list[tuple[tuple[Chunk, ...], tuple[int, ...]]]:
        """Each stage's chunks and chain layers."""
        by_stage: list[list[Chunk]] = [[] for _ in range(lay.pp)]
        for c in self.chunks(lay):  # model order within each stage
            by_stage[c.stage].append(c)
        out = []
        for chunks in by_stage:
            idx = tuple(i for c in chunks for i in range(c.first_layer, c.last_layer + 1))
            out.append((tuple(chunks), idx))
        return out

    def _stages(self, lay: Layout) -> tuple[Stage, ...]:
        """The distinct stages of a pp x v layout. Stages with identical layers and position
        (first/middle/last) cost the same, and in-flight micro-batches never grow with the
        stage index but under a split backward (`Layout.per_stage`), so only the first is kept."""
        p = self.profile
        stages: list[Stage] = []
        seen: set[tuple] = set()
        for st, (mine, idx) in enumerate(self._stage_layers(lay)):
            if not lay.per_stage:  # else every stage is kept
                signature = self._signature(idx, st, lay)
                if signature in seen:
                    continue
                seen.add(signature)
            layers = [p.layers[i] for i in idx]
            blocks = [x for x in layers if x.kind == LayerKind.BLOCK]
            dense = float(sum(x.params for x in layers))
            has_head = any(x.kind == LayerKind.HEAD for x in layers)
            has_emb = any(x.kind == LayerKind.EMBEDDING for x in layers)
            if has_head and p.tied_embeddings and not has_emb:
                dense += p.vocab * p.hidden  # the tied embedding's copy on the last stage
            stages.append(
                Stage(
                    index=st,
                    layers=idx,
                    dense_params=dense,
                    expert_params=float(sum(x.expert_params for x in layers)),
                    max_block_params=float(max((x.params for x in blocks), default=0)),
                    max_block_expert_params=float(
                        max((x.expert_params for x in blocks), default=0)
                    ),
                    n_blocks=len(blocks),
                    n_moe_blocks=sum(1 for x in blocks if x.expert_params),
                    has_embedding=has_emb,
                    has_head=has_head,
                    chunks=mine,
                )
            )
        return tuple(stages)

    def _stage_copies(self, lay: Layout) -> tuple[tuple[tuple[int, ...], int], ...]:
        """For every pipeline stage: its chain layers and the position in `stages(lay)` of
        the stage it looks exactly like."""
        reps: dict[tuple, int] = {}
        out = []
        for st, (_, idx) in enumerate(self._stage_layers(lay)):
            signature = self._signature(idx, st, lay)
            reps.setdefault(signature, len(reps))
            out.append((idx, reps[signature]))
        return tuple(out)
