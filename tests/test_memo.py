"""Memoized methods hold their object weakly (`planner/cost/memo.py`): an evaluator and its
search's memos go with the last reference to them, by reference counting, without Python's
cyclic collector; and the paused collector leaves what the search kept to the oldest
generation (`search_blocks.gc_paused`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.memo import memo_method
from paraplan.planner.model_parse import parse_model
from paraplan.planner.search import Search


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector disabled for the test (what it would free stays)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Doubler:
    def __init__(self) -> None:
        self.calls = 0
        self.double = memo_method(self, _Doubler._double)

    def _double(self, x: int) -> int:
        self.calls += 1
        return 2 * x


def test_memo_method_memoizes_and_holds_its_object_weakly(collector_off: None) -> None:
    d = _Doubler()
    assert [d.double(3), d.double(3), d.double(4)] == [6, 6, 8]
    assert d.calls == 2
    ref = weakref.ref(d)
    del d
    assert ref() is None  # reference counting freed it: no cycle through its memo


def test_a_searched_evaluator_is_freed_by_reference_counting(collector_off: None) -> None:
    profile = parse_model("gpt2").to_profile(seq_len=1024)
    ev = Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=16, seq_len=1024))
    result = Search(ev).run(top_k=2)
    assert result.ranked
    refs = [weakref.ref(x) for x in (ev, ev.stage_model, ev.stage_model.layouts, ev.per_layer)]
    del ev
    assert [r() for r in refs] == [None] * len(refs)


def test_the_paused_search_leaves_its_objects_unfrozen() -> None:
    profile = parse_model("gpt2").to_profile(seq_len=1024)
    ev = Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=16, seq_len=1024))
    was, frozen = gc.isenabled(), gc.get_freeze_count()
    Search(ev).run(top_k=2)
    assert gc.get_freeze_count() == frozen  # moved to the oldest generation, not left frozen
    assert gc.isenabled() == was
