"""A search shared by several processes (`planner/search_workers.py`) returns what one process
returns: the same ranked strategies (the best as brute force's), the same answer when nothing
fits, and one process's answer again when a child fails. Each block is explored by exactly one
process (claims counted across real forks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paraplan.planner import search_workers
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search, rank_key
from paraplan.planner.search_brute import brute_force
from paraplan.planner.search_workers import Share, worker_count, workers_from_env
from tests.test_search import SMALL_SPACES, _evaluator

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the search forks only on Linux"
)


def _keys(result):
    return [(e.strategy, rank_key(e)) for e in result.ranked]


@linux_only
@pytest.mark.parametrize(
    ("space", "fix", "workers"),
    [
        ("small-gpt-16xa100-nodes-of-2", "", 2),
        ("small-gpt-16xa100-nodes-of-2", "", 3),
        ("gqa-llama-4xl4-memory-bound", "", 2),
        ("tiny-moe-8xh100", "", 2),
        ("gpt2-8xh100", "tp=2,zero=1,recompute=selective", 2),
    ],
)
def test_shared_search_ranks_as_one_process_and_brute_force(space, fix, workers):
    ev = _evaluator(**SMALL_SPACES[space])
    pins = Pins.parse(fix)
    alone = Search(ev, pins, workers=1).run(top_k=3)
    shared = Search(ev, pins, workers=workers).run(top_k=3)
    assert _keys(shared) == _keys(alone)
    everything = brute_force(ev, pins)  # the best (runners-up skip dominated variants)
    assert shared.best is not None
    assert (shared.best.strategy, rank_key(shared.best)) == (
        everything[0].strategy,
        rank_key(everything[0]),
    )
    assert shared.evaluated > 0


@linux_only
def test_shared_search_finds_the_same_least_memory_when_nothing_fits():
    ev = _evaluator("llama3-405b", "8xl4", global_batch=8, seq_len=8192)
    alone = Search(ev, workers=1).run(top_k=3)
    shared = Search(ev, workers=2).run(top_k=3)
    assert shared.ranked == alone.ranked == ()
    assert shared.min_memory is not None and alone.min_memory is not None
    assert shared.min_memory.strategy == alone.min_memory.strategy
    assert shared.min_memory.memory.total_bytes == alone.min_memory.memory.total_bytes
    assert shared.evaluated == alone.evaluated  # nothing pruned by time: the same visits


@linux_only
def test_a_failing_child_leaves_the_search_to_the_parent(monkeypatch):
    ev = _evaluator(**SMALL_SPACES["small-gpt-16xa100-nodes-of-2"])
    expected = _keys(Search(ev, workers=1).run(top_k=3))
    parent = os.getpid()
    explore = Search._explore

    def failing_in_children(self, *args, **kwargs):
        if os.getpid() != parent:
            raise RuntimeError("a child breaks")
        return explore(self, *args, **kwargs)

    calls = []
    shared = search_workers.explore_shared

    def counted(*args, **kwargs):
        found = shared(*args, **kwargs)
        calls.append(found)
        return found

    monkeypatch.setattr(Search, "_explore", failing_in_children)
    monkeypatch.setattr("paraplan.planner.search.explore_shared", counted)
    assert _keys(Search(ev, workers=2).run(top_k=3)) == expected
    assert calls == [None]  # the shared attempt gave up, and the parent searched alone


@linux_only
def test_a_refused_fork_leaves_the_search_to_one_process(monkeypatch):
    ev = _evaluator(**SMALL_SPACES["small-gpt-16xa100-nodes-of-2"])
    expected = _keys(Search(ev, workers=1).run(top_k=3))

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(search_workers.os, "fork", no_fork)
    assert _keys(Search(ev, workers=2).run(top_k=3)) == expected


@linux_only
def test_each_block_is_claimed_by_exactly_one_process():
    blocks, forks = 500, 3
    share = Share(blocks)
    read, write = os.pipe()
    pids = []
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:  # a child: claim every block it can, report how many it got
            got = sum(1 for i in range(blocks) if share.claim(i))
            os.write(write, got.to_bytes(4, "little"))
            os._exit(0)
        pids.append(pid)
    mine = sum(1 for i in range(blocks) if share.claim(i))
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(write)
    data = os.read(read, 4 * forks)
    os.close(read)
    counts = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    assert len(counts) == forks
    assert mine + sum(counts) == blocks
    assert share.claim(0) == 0  # taken
    share.close()


def test_shared_incumbent_is_the_least_reported():
    share = Share(1)
    assert share.worst_s(float("inf")) == float("inf")
    assert share.worst_s(5.0) == 5.0
    assert share.worst_s(7.0) == 5.0  # another process's better K-th best prunes here too
    assert share.worst_s(3.0) == 3.0
    share.close()


def test_worker_count_reads_the_environment(monkeypatch):
    monkeypatch.delenv(search_workers.WORKERS_ENV, raising=False)
    assert workers_from_env() is None
    assert worker_count(search_workers.MIN_SHARED_BLOCKS - 1) == 1  # small: one process
    monkeypatch.setenv(search_workers.WORKERS_ENV, "1")
    assert worker_count(10_000) == 1
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(search_workers.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=r"PARAPLAN_SEARCH_WORKERS=.*whole number"):
            worker_count(10_000)
    monkeypatch.setattr(search_workers.sys, "platform", "darwin")
    monkeypatch.setenv(search_workers.WORKERS_ENV, "4")
    assert worker_count(10_000) == 1  # forks only on Linux


def test_bad_worker_count_is_refused_before_planning():
    env = dict(os.environ, **{search_workers.WORKERS_ENV: "many"})
    argv = ["plan", "--model", "gpt2", "--cluster", "8xh100", "--global-batch", "16"]
    done = subprocess.run(
        [sys.executable, "-m", "paraplan.cli", *argv, "--model-source", "spec"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert "PARAPLAN_SEARCH_WORKERS='many'" in done.stderr
    assert "Traceback" not in done.stderr


def test_plan_help_names_the_environment_variable():
    done = subprocess.run(
        [sys.executable, "-m", "paraplan.cli", "plan", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert search_workers.WORKERS_ENV in done.stdout.replace("\n", " ")
