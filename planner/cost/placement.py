"""Collective times no mesh order of a strategy beats: what the search's time bounds price
communication with (`planner/search_bounds.py`).

`Collectives(acc, lower_bound=True)` bounds any placement by the fastest link with no latency,
which is far below what a group that must span nodes takes (a data-parallel group of 24 ranks
at NVLink speed). `PlacementBound` is tighter and as safe: the links a strategy's groups get in
each of its mesh orders are known (`Evaluator.links_in_order`), so a collective over a group of
n ranks takes at least the least time the real `Collectives` give for any of those links of n
ranks, whichever field (tensor, data, context parallel, ...) and order it comes from. Each
figure is the real model's own for one such link, so it is below or equal to the time of that
collective in every order, bit for bit; the step time only adds, maximizes and overlaps these
(`hidden_behind` never decreases when the communication grows), so a step time priced with
them on any links of the right sizes bounds the step time of every mesh order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

from ..hardware import Accelerator
from .comm import AxisLink, Collectives, Links
from .routing import Routing


class PlacementBound(Collectives):
    """Collectives over groups of a given size at the least time of the links `links` hold
    for that size (see the module docstring); the link passed in is read for its size only.
    Sizes the links do not hold fall back to `fallback` (the fastest link, no latency)."""

    def __init__(
        self,
        acc: Accelerator,
        real: Collectives,
        fallback: Collectives,
        links: Iterable[Links],
        memo_key: tuple,
    ) -> None:
        super().__init__(acc)
        self.real = real
        """The collectives the step time is priced with."""
        self.fallback = fallback
        """A bound for any placement (`Collectives(acc, lower_bound=True)`)."""
        by_size: dict[int, set[AxisLink]] = {}
        for one in links:
            for f in fields(one):
                link: AxisLink = getattr(one, f.name)
                by_size.setdefault(link.size, set()).add(link)
        self.candidates: dict[int, tuple[AxisLink, ...]] = {
            n: tuple(sorted(found, key=lambda a: (a.per_node, a.nodes)))
            for n, found in by_size.items()
        }
        """The links of each group size across the mesh orders."""
        self.memo_key = memo_key
        """What identifies these candidates (`Evaluator.stage_core` memoizes on it)."""
        self._least: dict[tuple, float] = {}

    @property
    def bounds_placements(self) -> bool:
        """A bound (`Collectives.bounds_placements`)."""
        return True

    def _min(self, kind: str, nbytes: float, link: AxisLink) -> float:
        key = (kind, nbytes, link.size)
        found = self._least.get(key)
        if found is None:
            options = self.candidates.get(link.size)
            if options is None:
                found = getattr(self.fallback, kind)(nbytes, link)
            else:
                price = getattr(self.real, kind)
                found = min(price(nbytes, one) for one in options)
            self._least[key] = found
        return found

    def all_reduce(self, nbytes: float, link: AxisLink) -> float:
        """The least all-reduce time over the candidate links of this size."""
        return self._min("all_reduce", nbytes, link)

    def all_gather(self, nbytes: float, link: AxisLink) -> float:
        """The least all-gather time over the candidate links of this size."""
        return self._min("all_gather", nbytes, link)

    def reduce_scatter(self, nbytes: float, link: AxisLink) -> float:
        """The least reduce-scatter time over the candidate links of this size."""
        return self._min("reduce_scatter", nbytes, link)

    def all_to_all(self, nbytes: float, link: AxisLink) -> float:
        """The least all-to-all time over the candidate links of this size."""
        return self._min("all_to_all", nbytes, link)

    def dispatch(self, token_bytes: float, routing: Routing, link: AxisLink) -> float:
        """The least dispatch time over the candidate links of this size."""
        key = ("dispatch", token_bytes, routing, link.size)
        found = self._least.get(key)
        if found is None:
            options = self.candidates.get(link.size)
            if options is None:
                found = self.fallback.dispatch(token_bytes, routing, link)
            else:
                found = min(self.real.dispatch(token_bytes, routing, one) for one in options)
            self._least[key] = found
        return found

    def p2p(self, nbytes: float, cross_node: bool) -> float:
        """The faster of a send inside a node and one between nodes."""
        return min(self.real.p2p(nbytes, False), self.real.p2p(nbytes, True))
