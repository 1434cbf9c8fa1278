"""The search's reference for tests: every valid strategy evaluated in full (`brute_force`),
which `Search.run` must equal."""

from __future__ import annotations

from . import options
from .cost.evaluate import Estimate, Evaluator
from .frameworks import FrameworkSpace
from .pins import Pins
from .search import Search
from .search_blocks import rank_key


def brute_force(
    ev: Evaluator,
    pins: Pins | None = None,
    *,
    runnable_only: bool = False,
    space: FrameworkSpace | None = None,
) -> list[Estimate]:
    """Every valid strategy in every mesh order (the executor's only, or a framework's `space`,
    as `Search`), evaluated in full and ranked (for tests)."""
    search = Search(ev, pins, runnable_only=runnable_only, space=space)
    out = [
        ev.evaluate(s)
        for s in search.valid()
        if not (runnable_only and search._gap(s)) and options.fits_host(ev, s)
    ]
    return sorted((e for e in out if e.feasible), key=rank_key)
