"""The search's exact shortcuts (issue 16): what they assume holds, and the search that takes
them still finds the brute-force optimum among the strategies the executor runs."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from paraplan.planner import options
from paraplan.planner.capabilities import Job, executor_gaps
from paraplan.planner.config import Optimizer, Precision
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search, brute_force
from paraplan.planner.strategy import Recompute, Schedule, Strategy
from tests.test_search import SMALL_SPACES, _evaluator


def _gaps(s: Strategy, experts: int = 0) -> tuple[str, ...]:
    return executor_gaps(
        Job(strategy=s, experts=experts, precision=Precision.BF16, optimizer=Optimizer.ADAMW)
    )


def _strategies() -> list[Strategy]:
    """A grid over every field the capability checks read."""
    out = []
    for pp, schedule, v in (
        (1, Schedule.NONE, 1),
        (2, Schedule.ONE_F_ONE_B, 1),
        (2, Schedule.INTERLEAVED_1F1B, 2),
        (2, Schedule.INTERLEAVED_ZB, 1),
        (2, Schedule.ZBV, 2),
        (2, Schedule.DUALPIPEV, 2),
    ):
        for dp, tp, cp, ep, zero, off in itertools.product(
            (1, 4), (1, 2), (1, 2), (1, 2), range(4), (False, True)
        ):
            if off and zero == 0:
                continue
            out.append(
                Strategy(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=ep,
                    schedule=schedule,
                    virtual_stages=v,
                    zero_stage=zero,
                    offload_optimizer=off,
                )
            )
    return out


@pytest.mark.parametrize("experts", [0, 8])
def test_runnable_depends_on_neither_sp_nor_recompute(experts: int) -> None:
    """`Search._runnable` asks each (ZeRO stage, optimizer offload) pair once per schedule."""
    for s in _strategies():
        want = _gaps(s, experts)
        for sp, rc in itertools.product((False, True), Recompute):
            assert _gaps(replace(s, sequence_parallel=sp, recompute=rc), experts) == want


@pytest.mark.parametrize("experts", [0, 8])
def test_runnable_does_not_depend_on_the_micro_batch_size(experts: int) -> None:
    """`Search._runnable` shares its answer between blocks that differ only by it."""
    for s in _strategies():
        want = _gaps(s, experts)
        for mbs in (2, 3, 8):
            assert _gaps(replace(s, micro_batch_size=mbs), experts) == want


@pytest.mark.parametrize("experts", [0, 8])
def test_offload_rescues_of_an_unrunnable_strategy_are_unrunnable(experts: int) -> None:
    """The search drops an unrunnable strategy before pricing it, rescues included."""
    for s in _strategies():
        if not _gaps(s, experts):
            continue
        for tier in options.rescues(s, Pins()):
            for variant in tier:
                assert _gaps(variant, experts), variant.short()


@pytest.mark.parametrize("space", list(SMALL_SPACES))
def test_runnable_search_finds_the_brute_force_optimum(space: str) -> None:
    """With nothing pinned and the heap full early (top 4), the shortcuts for unrunnable
    strategies keep the optimum: the best runnable strategy of brute force."""
    ev = _evaluator(**SMALL_SPACES[space])
    runnable = brute_force(ev, runnable_only=True)
    assert runnable, "the case should have runnable strategies that fit"
    result = Search(ev, runnable_only=True).run(top_k=3)
    assert result.best is not None
    assert result.best.strategy == runnable[0].strategy  # mesh order included
    assert result.best.step_time_s == runnable[0].step_time_s
    assert result.best.memory.total_bytes == runnable[0].memory.total_bytes
    for est in result.ranked:
        assert not _gaps(est.strategy, ev.profile.experts)
