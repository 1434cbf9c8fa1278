"""Pipeline layout: which chain layers each stage (and each interleaved chunk) runs.

Stages are cut by cost, not by count: `balanced_cuts` splits the blocks into contiguous chunks
minimizing the slowest chunk's seconds (the linear-partition problem that PipeDream, Narayanan
et al. 2019 §3.1, and Megatron-LM's uneven split solve), with the embedding joined to the first
block and the head and loss to the last, so a heavy head or embedding pulls blocks off its
stage. Among the splits that reach the optimum, the one closest to an even count is taken.

Chunks are placed on stages in a loop (chunk c on stage c % pp, Narayanan et al. 2021 §2.2) or,
for ZB-V and DualPipeV, in a V (chunk c on stage c for c < pp, else 2 pp - 1 - c: Qi et al.
2023 §6; torch's `generate_stage_to_rank_mapping(style="v")`), so the first stage holds both
the embedding and the head, and the last stage passes its first chunk's output to its second
chunk without a send.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..strategy import Recompute

_REL = 1e-9
"""Relative slack when comparing a chunk's seconds with the bottleneck."""
_BISECTIONS = 200
"""Bisection steps for the bottleneck (ends far below float resolution)."""


class StageSplit(StrEnum):
    """How the blocks are split over the pipeline chunks."""

    BALANCED = "balanced"
    """By cost (`balanced_cuts`): the default."""
    EVEN = "even"
    """By count alone (`block_counts`), as Megatron-LM's default split: for comparison and
    for pricing published configurations that used it."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What a pipeline split is balanced for: its shape, and what weighs a block against the
    embedding and head (recompute redoes blocks only; each block runs four TP collectives,
    the embedding and head one each)."""

    pp: int
    """Pipeline stages."""
    virtual_stages: int
    """Chunks per stage."""
    recompute: Recompute
    """Uniform recompute of the blocks (none also stands for per-layer policies)."""
    tp: int
    """Tensor-parallel degree."""
    sequence_parallel: bool
    """Sequence parallelism (its collectives)."""
    v_shaped: bool = False
    """Chunks placed in a V (ZB-V, DualPipeV: stage s holds chunks s and 2 pp - 1 - s) rather
    than in a loop (chunk c on stage c % pp)."""
    per_stage: bool = False
    """Keep every stage, even one that looks like another: a split backward (zero bubble,
    DualPipeV) holds more micro-batches on later stages (cost/schedules.py)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous range of chain layers run by one pipeline rank."""

    stage: int
    """Pipeline rank that runs it."""
    index: int
    """Position of the chunk in the model (0 .. pp*v-1)."""
    first_layer: int
    """First chain index (0 is the embedding)."""
    last_layer: int
    """Last chain index, inclusive."""


def block_counts(num_blocks: int, num_chunks: int) -> list[int]:
    """Blocks per chunk, as even as possible; spare blocks go to the chunks that hold neither
    the embedding nor the (costly) head first, then to the first, then the last chunk."""
    if num_chunks > num_blocks:
        raise ValueError(
            f"{num_chunks} pipeline chunks for {num_blocks} blocks: every chunk needs a block; "
            "reduce pp * virtual_stages"
        )
    base, spare = divmod(num_blocks, num_chunks)
    counts = [base] * num_chunks
    order = [*list(range(1, num_chunks - 1)), 0, num_chunks - 1]
    for i in order[:spare]:
        counts[i] += 1
    return counts


def _parts_needed(costs: Sequence[float], bound: float, max_units: int) -> int:
    """Fewest contiguous parts, each at most `bound` seconds and `max_units` units (greedy
    from the left, optimal as both limits hold for any sub-range of a part that meets them)."""
    parts, running, units = 1, 0.0, 0
    for c in costs:
        if running + c > bound or units == max_units:
            parts, running, units = parts + 1, c, 1
        else:
            running, units = running + c, units + 1
    return parts


def _greedy_trace(costs: Sequence[float], bound: float, max_units: int) -> tuple[int, float, float]:
    """`_parts_needed`, with the interval of bounds over which its answer holds: every
    comparison of a running sum with the bound goes the same way for any bound from the
    largest sum found within it to the least sum found over it (excluded), so the greedy
    takes the same steps and counts the same parts there. (count, from, to)."""
    parts, running, units = 1, 0.0, 0
    below, above = -math.inf, math.inf
    for c in costs:
        x = running + c
        if x > bound:
            if x < above:
                above = x
            parts, running, units = parts + 1, c, 1
        else:
            if x > below:
                below = x
            if units == max_units:
                parts, running, units = parts + 1, c, 1
            else:
                running, units = x, units + 1
    return parts, below, above


class BalancedCuts:
    """`balanced_cuts` of one cost vector for any chunk count: the search asks it for many
    counts of the same blocks' seconds. The bisection for the bottleneck asks the greedy
    (`_parts_needed`, with every unit allowed in a part) at many bounds, and its answer is a
    step function of the bound: each answer is kept with the interval of bounds it holds for
    (`_greedy_trace`), and a bound inside a known interval is answered without a pass. So
    the bisection takes the very steps `_parts_needed` would, bit for bit."""

    def __init__(self, unit_costs_s: Sequence[float]) -> None:
        self.costs = [float(c) for c in unit_costs_s]
        self._total = sum(self.costs)
        self._largest = max(self.costs, default=0.0)
        self._even_only = any(c < 0 for c in self.costs) or self._total <= 0
        """Whether every chunk count gets the even split (a negative or no cost at all)."""
        self._starts: list[float] = []
        """Sorted lower ends of the known intervals (with their `_ends`, `_parts`)."""
        self._ends: list[float] = []
        self._parts: list[int] = []

    def _parts_needed(self, bound: float) -> int:
        """`_parts_needed(costs, bound, len(costs))`."""
        i = bisect.bisect_right(self._starts, bound) - 1
        if i >= 0 and bound < self._ends[i]:
            return self._parts[i]
        parts, below, above = _greedy_trace(self.costs, bound, len(self.costs))
        if below < above:  # holds on [below, above), bound included
            j = bisect.bisect_right(self._starts, below)
            self._starts.insert(j, below)
            self._ends.insert(j, above)
            self._parts.insert(j, parts)
        return parts

    def cuts(self, num_chunks: int) -> list[int]:
        """`balanced_cuts(unit_costs_s, num_chunks)`."""
        costs = self.costs
        n = len(costs)
        even = block_counts(n, num_chunks)
        if num_chunks == 1 or self._even_only:
            return even
        if num_chunks == n:  # one unit per chunk: the only split
            return even
        lo, hi = self._largest, self._total
        for _ in range(_BISECTIONS):
            if hi - lo <= _REL * hi:
                break
            mid = (lo + hi) / 2
            if self._parts_needed(mid) <= num_chunks:
                hi = mid
            else:
                lo = mid
        bound = hi * (1 + _REL)
        low_k, high_k = -(-n // num_chunks), n  # the fewest units the largest chunk can hold
        if low_k < high_k and _parts_needed(costs, bound, low_k) <= num_chunks:
            high_k = low_k  # the usual answer: the fewest parts never grow with the limit
        while low_k < high_k:
            mid_k = (low_k + high_k) // 2
            if _parts_needed(costs, bound, mid_k) <= num_chunks:
                high_k = mid_k
            else:
                low_k = mid_k + 1
        most = low_k
        # reach[p]: end of the largest part starting at p under both limits (two pointers);
        # suffix_parts[p]: fewest parts the units p.. need (greedy from p is optimal)
        reach_of, end, running = [0] * n, 0, 0.0
        for p in range(n):
            if end < p:
                end, running = p, 0.0
            stop = p + most if p + most < n else n  # end < n and end - p < most
            while end < stop and running + costs[end] <= bound:
                running += costs[end]
                end += 1
            if end > p:
                reach_of[p] = end
                running -= costs[p]
            else:  # an empty reach (nothing fits): the unit alone
                reach_of[p] = p + 1
        # -suffix_parts[p]: the fewest parts the units p.. need, negated; `reach_of` never
        # decreases, so neither does this (greedy from a later unit needs no more parts)
        neg_parts = [0] * (n + 1)
        for p in range(n - 1, -1, -1):
            neg_parts[p] = neg_parts[reach_of[p]] - 1
        cuts, start, even_end = [], 0, 0
        for c in range(num_chunks - 1):
            even_end += even[c]
            left = num_chunks - c - 1  # chunks still to place after this one
            # the cut e must leave `left` non-empty chunks that meet both limits: e in
            # (start, reach], e <= n - left and at most `left` parts from e, an interval
            # (max and min written out: this loop runs for every chunk of every count)
            first = bisect.bisect_left(neg_parts, -left)
            first = first if first > start else start + 1
            last = reach_of[start]
            last = last if last < n - left else n - left
            if first > last:  # cannot happen (the optimum is reachable); keep the even split
                return even
            end = even_end if even_end > first else first  # the cut nearest the even split's
            end = end if end < last else last
            cuts.append(end - start)
            start = end
        cuts.append(n - start)
        return cuts


def balanced_cuts(unit_costs_s: Sequence[float], num_chunks: int) -> list[int]:
    """Units per chunk for `num_chunks` contiguous, non-empty chunks minimizing the largest
    chunk's seconds; among those, the largest chunk's unit count (so the stages that do not
    bound the time share the blocks evenly); then each cut as close as it can be to the even
    split's (`block_counts`). `BalancedCuts` answers it for many chunk counts at once."""
    return BalancedCuts(unit_costs_s).cuts(num_chunks)


def chunk_stage(chunk: int, pp: int, v_shaped: bool) -> int:
    """Stage that runs model chunk `chunk`: c % pp in a loop; in a V of 2 pp chunks, c on the
    way down and 2 pp - 1 - c on the way back (as `solvers.pipeline_orders.v_chunk_stage`)."""
    if not v_shaped:
        return chunk % pp
    return chunk if chunk < pp else 2 * pp - 1 - chunk


def chunks_from_counts(
    counts: Sequence[int], pp: int, *, v_shaped: bool = False
) -> tuple[Chunk, ...]:
    """Chunks in model order from blocks per chunk, placed by `chunk_stage`; the embedding
    joins the first chunk and the head the last."""
    chunks = []
    start = 1  # chain index 0 is the embedding, which joins the first chunk
    last_block = sum(counts)
    for c, count in enumerate(counts):
        first = 0 if c == 0 else start
        end = start + count - 1
        last = last_block + 1 if c == len(counts) - 1 else end
        stage = chunk_stage(c, pp, v_shaped)
        chunks.append(Chunk(stage=stage, index=c, first_layer=first, last_layer=last))
        start = end + 1
    return tuple(chunks)


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: its layers and per-sequence sums over them."""

    index: int
    """Stage index (the first of the stages that look exactly like this one)."""
    layers: tuple[int, ...]
    """Chain indices of its layers, in model order."""
    dense_params: float
    """Parameters every tensor-parallel rank shards (tied copy of the embedding included)."""
    expert_params: float
    """MoE expert parameters."""
    max_block_params: float
    """Dense parameters of its largest block (an FSDP unit)."""
    max_block_expert_params: float
    """Expert parameters of its largest block."""
    n_blocks: int
    """Blocks it runs."""
    n_moe_blocks: int
    """Of which hold experts."""
    has_embedding: bool
    """Whether it runs the embedding."""
    has_head: bool
    """Whether it runs the head and loss."""
    chunks: tuple[Chunk, ...]
    """Its model chunks."""
    param_tensors: int = 0
    """Parameter tensors its layers first use (`LayerCost.param_tensors`; 0 when not traced)."""


def p2p_sends(stage: Stage, num_chunks: int) -> int:
    """Point-to-point sends of `stage` per micro-batch: each of its chunks sends its output
    forward and its input gradient backward, except at the ends of the model and where the
    neighbouring chunk runs on the same stage (the V's turn: torch passes the tensor on
    locally)."""
    mine = {c.index for c in stage.chunks}
    sends = 0
    for c in mine:
        sends += int(c + 1 < num_chunks and c + 1 not in mine)
        sends += int(c > 0 and c - 1 not in mine)
    return sends
