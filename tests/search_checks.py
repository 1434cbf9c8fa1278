"""The check the search tests share: `Search.run` returns brute force's best."""

from __future__ import annotations

from paraplan.planner.cost.evaluate import Estimate, Evaluator
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.search_brute import brute_force


def assert_search_is_exact(ev: Evaluator, fixes: tuple[str, ...]) -> list[Estimate]:
    """For each `--fix` text: the search's best is brute force's (strategy and step time);
    brute force's ranking under the last one, for further checks."""
    everything: list[Estimate] = []
    for fix in fixes:
        pins = Pins.parse(fix)
        best = Search(ev, pins).run(top_k=3).best
        everything = brute_force(ev, pins)
        assert best is not None and everything
        assert best.strategy == everything[0].strategy
        assert best.step_time_s == everything[0].step_time_s
    return everything
