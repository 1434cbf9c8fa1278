"""`BalancedCuts` (issue 16): the search's balanced split for many chunk counts of one cost
vector gives, bit for bit, the cuts of the one-count algorithm it replaced (kept here as the
reference), and each remembered greedy answer holds over the whole interval it is kept for."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from paraplan.planner.cost.layout import (
    BalancedCuts,
    _greedy_trace,
    _parts_needed,
    balanced_cuts,
    block_counts,
)

_REL = 1e-9
_BISECTIONS = 200


def _reference_cuts(unit_costs_s: Sequence[float], num_chunks: int) -> list[int]:
    """`balanced_cuts` as it was before `BalancedCuts` (commit 789101b)."""
    costs = [float(c) for c in unit_costs_s]
    n = len(costs)
    even = block_counts(n, num_chunks)
    if num_chunks == 1 or any(c < 0 for c in costs) or sum(costs) <= 0:
        return even
    lo, hi = max(costs), sum(costs)
    for _ in range(_BISECTIONS):
        if hi - lo <= _REL * hi:
            break
        mid = (lo + hi) / 2
        if _parts_needed(costs, mid, n) <= num_chunks:
            hi = mid
        else:
            lo = mid
    bound = hi * (1 + _REL)
    low_k, high_k = -(-n // num_chunks), n
    while low_k < high_k:
        mid_k = (low_k + high_k) // 2
        if _parts_needed(costs, bound, mid_k) <= num_chunks:
            high_k = mid_k
        else:
            low_k = mid_k + 1
    most = low_k
    reach_of, end, running = [0] * n, 0, 0.0
    for p in range(n):
        if end < p:
            end, running = p, 0.0
        while end < n and end - p < most and running + costs[end] <= bound:
            running += costs[end]
            end += 1
        reach_of[p] = max(end, p + 1)
        running -= costs[p] if end > p else 0.0
    suffix_parts = [0] * (n + 1)
    for p in range(n - 1, -1, -1):
        suffix_parts[p] = 1 + suffix_parts[reach_of[p]]
    cuts, start, even_end = [], 0, 0
    for c in range(num_chunks - 1):
        even_end += even[c]
        left = num_chunks - c - 1
        reach = reach_of[start]
        feasible = [
            e for e in range(start + 1, reach + 1) if n - e >= left and suffix_parts[e] <= left
        ]
        if not feasible:
            return even
        end = min(feasible, key=lambda e: (abs(e - even_end), e))
        cuts.append(end - start)
        start = end
    cuts.append(n - start)
    return cuts


def _vectors(seed: int) -> list[list[float]]:
    """Cost vectors like the search's (equal blocks, a heavier first and last unit) and
    harder ones (random, zeros, ties, values whose sums round)."""
    rng = random.Random(seed)
    out = []
    for n in (2, 3, 7, 16, 61, 96, 128):
        c = rng.uniform(1e-4, 1.0)
        out.append([c * rng.uniform(1, 3), *[c] * (n - 2), c * rng.uniform(1, 6)][:n])
        out.append([rng.uniform(0.0, 1.0) for _ in range(n)])
        out.append([rng.choice((0.0, 0.1, 0.3, 1.0 / 3.0, 0.7)) for _ in range(n)])
        out.append([rng.choice((1.0, 1.0 + 2**-52, 2**-30, 3.0)) for _ in range(n)])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_cuts_equal_the_reference_for_every_count(seed: int) -> None:
    for costs in _vectors(seed):
        table = BalancedCuts(costs)  # shared over the counts, as the search shares it
        counts = list(range(1, len(costs) + 1))
        random.Random(seed).shuffle(counts)
        for k in counts:
            want = _reference_cuts(costs, k)
            assert table.cuts(k) == want, (costs, k)
            assert balanced_cuts(costs, k) == want, (costs, k)


@pytest.mark.parametrize("seed", range(6))
def test_a_greedy_answer_holds_over_its_interval(seed: int) -> None:
    """`_greedy_trace`'s count is `_parts_needed`'s at every bound of its interval (its ends
    included where finite, the upper one just below it), which `BalancedCuts` relies on."""
    rng = random.Random(seed)
    for costs in _vectors(seed):
        n, total = len(costs), sum(costs)
        for _ in range(30):
            bound = rng.uniform(0.0, total * 1.1)
            units = rng.randint(1, n)
            parts, below, above = _greedy_trace(costs, bound, units)
            assert parts == _parts_needed(costs, bound, units)
            assert below <= bound < above
            low = below if math.isfinite(below) else bound - total
            high = math.nextafter(above, -math.inf) if math.isfinite(above) else bound + total
            for b in (low, high, *(rng.uniform(low, high) for _ in range(5))):
                assert _parts_needed(costs, b, units) == parts, (costs, bound, b)
