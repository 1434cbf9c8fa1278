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
from paraplan.planner.search import Search
from paraplan.planner.search_brute import brute_force
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
    """The search drops an unrunnable strategy before pricing it, rescues included. ZeRO-3
    with optimizer offload alone is unrunnable, and its rescue with the parameters offloaded
    runs: the runnable search never builds it unless `offload_params` is pinned false
    (`options.params_follow_optimizer`), and then no rescue offloads the parameters."""
    for s in _strategies():
        if not _gaps(s, experts):
            continue
        alone = s.zero_stage == 3 and s.offload_optimizer and not s.offload_params
        pins = Pins(offload_params=False) if alone else Pins()
        assert options.params_follow_optimizer(pins, runnable_only=True) is not alone
        for tier in options.rescues(s, pins):
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


def test_runnable_search_offloads_zero3_parameters_with_the_optimizer() -> None:
    """The executor offloads ZeRO-3's optimizer through FSDP2's CPUOffloadPolicy, which keeps
    the parameter shards on the host too: a runnable search prices exactly that (each shard
    copied in for its gathers), equal to brute force over the same space, where the search for
    any engine also offers the optimizer offload alone (DeepSpeed's `offload_optimizer`)."""
    ev = _evaluator(
        "llama:layers=16,hidden=4096,heads=32,kv_heads=8,ffn=11008,vocab=32000,seq=1024",
        "2xl4",
        global_batch=2,
        seq_len=1024,
    )
    runnable = brute_force(ev, runnable_only=True)
    best = runnable[0].strategy
    assert best.offload_optimizer  # nothing fits without
    # over one shard rank (tp=2) every copy is serial (`cost/offload.py`): ZeRO-2's one fp32
    # copy per micro-batch beats ZeRO-3's two plus the gradients', which still ranks
    zero3 = [e.strategy for e in runnable[:10] if e.strategy.zero_stage == 3]
    assert zero3 and all(s.offload_optimizer and s.offload_params for s in zero3)
    result = Search(ev, runnable_only=True).run(top_k=3)
    assert result.best is not None and result.best.strategy == best
    assert result.best.step_time_s == runnable[0].step_time_s
    for est in result.ranked:
        s = est.strategy
        assert not (s.zero_stage == 3 and s.offload_optimizer and not s.offload_params)
    anywhere = [e.strategy for e in brute_force(ev)]
    alone = [s for s in anywhere if s.zero_stage == 3 and s.offload_optimizer]
    assert alone and not any(s.offload_params for s in alone)
