"""`paraplan calibrate` when a rank fails (the notebook 04 CI failure of 2026-11-25, whose
cause the notebook did not print): the rank's own error reaches the user in one line, a first
failure is measured again on a new port, a second exits 1 and writes nothing. The failure is
real: rank 0's store cannot listen on a port another socket holds."""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from paraplan.cli import main
from paraplan.profiler import microbench_run

QUICK_FP32 = ["--quick", "--dtypes", "fp32", "--no-progress"]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A local port with a listening socket on it for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.multiprocess
def test_a_rank_failing_twice_exits_1_names_the_error_and_writes_nothing(
    tmp_path: Path,
    held_port: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(microbench_run, "_free_port", lambda: held_port)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--cluster", "2xcpu", "-o", str(out), *QUICK_FP32]) == 1
    lines = capsys.readouterr().err.splitlines()
    err = [line for line in lines if "a calibration rank failed" in line]  # not "busy machine"
    assert len(err) == 2, lines
    assert err[0].startswith("paraplan: warning: a calibration rank failed: ")
    assert err[1].startswith("paraplan: error: a calibration rank failed: ")
    assert "address already in use" in err[1] and err[1].endswith("(twice); nothing written")
    assert not out.exists()


@pytest.mark.multiprocess
def test_a_rank_failing_once_is_measured_again(
    held_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from paraplan.planner.cluster import parse_cluster

    free = microbench_run._free_port
    ports = itertools.chain([held_port], iter(free, None))
    monkeypatch.setattr(microbench_run, "_free_port", lambda: next(ports))
    seen: list[tuple[int, int, str]] = []
    cal = microbench_run.calibrate(
        parse_cluster("2xcpu"),
        quick=True,
        dtypes=["fp32"],
        progress=lambda done, total, label: seen.append((done, total, label)),
    )
    assert cal.world_size == 2 and cal.dtypes == ("fp32",) and cal.collectives
    # the bar counts every measurement, the executor's runtime ones after the collectives
    # too (it stood full for 23 s of a 41 s run while they went on), and ends full
    assert [label for *_, label in seen[-5:]] == list(microbench_run.MULTI_RANK_PARTS)
    assert [done for done, *_ in seen] == list(range(1, len(seen) + 1))
    assert seen[-1][0] == seen[-1][1]
    err = capsys.readouterr().err
    assert "paraplan: warning: a calibration rank failed: " in err
    assert "address already in use" in err and "measuring again on a new port" in err


@pytest.mark.multiprocess
def test_one_rank_calibrates_without_collectives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One device (1xcpu here, a single GPU the same way) has no link to measure: before, its
    rank sent a message to itself and hung (in-process) or crashed (SIGSEGV, spawned)."""
    from paraplan.planner.cluster import load_cluster_file

    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--cluster", "1xcpu", "-o", str(out), *QUICK_FP32]) == 0
    assert "one rank measures no collective" in capsys.readouterr().out
    cal = load_cluster_file(out).calibration
    assert cal is not None and cal.collectives == () and cal.world_size == 1


def test_gpu_budget_reaches_training_sizes_and_cpu_budget_is_unchanged() -> None:
    import torch

    from paraplan.profiler import microbench as mb
    from paraplan.profiler.microbench_attention import ATTENTION_WIDTH

    assert mb.for_device(mb.FULL, torch.device("cpu")) == mb.FULL
    gpu = mb.for_device(mb.FULL, torch.device("cuda"))
    assert max(gpu.gemm_sizes) >= 8192
    # a 1B Llama's attention (32 heads of 64), 4 sequences of 2048 per micro-batch: the curve
    # reaches it (4 dense FLOPs per head dimension and query-key pair, as the curve counts)
    largest = 4 * ATTENTION_WIDTH * max(gpu.attention_seqs) ** 2
    assert largest >= 4 * (32 * 64) * 2048**2 * 4
    assert gpu.collective_bytes == mb.FULL.collective_bytes and gpu.rounds == mb.FULL.rounds


def _result_then_abort(rank: int, world: int, port: int, *rest: Any) -> None:
    """Rank 0 delivers a result; rank 1 then dies by SIGABRT, as gloo's teardown did (it waits
    for rank 0's marker file: a fixed sleep lost the race to rank 0's start-up once under load,
    the clean-clone CI of 2026-11-29)."""
    out = rest[-1]
    marker = Path(tempfile.gettempdir()) / f"paraplan-test-result-{port}"
    if rank == 0:
        out.put(("result", "measured"))
        out.close()
        out.join_thread()
        marker.touch()
        return
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    marker.unlink(missing_ok=True)
    os.abort()


def _abort_before_result(rank: int, world: int, port: int, *rest: Any) -> None:
    if rank == 1:
        os.abort()


@pytest.mark.multiprocess
def test_a_rank_aborting_as_it_exits_keeps_the_result() -> None:
    """The clean-clone CI of 2026-11-26: rank 1 aborted in gloo's teardown ("terminate called
    without an active exception") after rank 0's result arrived; the figures were complete."""
    run = microbench_run._run_ranks
    assert run(2, False, True, ("fp32",), 1, None, worker=_result_then_abort) == "measured"
    with pytest.raises(microbench_run.CalibrationRankError, match="SIGABRT"):
        run(2, False, True, ("fp32",), 1, None, worker=_abort_before_result)


def test_a_result_still_queued_is_read_after_the_ticks() -> None:
    """Another rank's exit seen before rank 0's result was read: the result comes after any
    progress ticks still queued; nothing queued within the grace is no result."""
    import queue

    from paraplan.profiler.rank_errors import queued_result

    out: queue.Queue[tuple[str, object]] = queue.Queue()
    for item in (("tick", "copies"), ("tick", "AdamW"), ("result", "measured")):
        out.put(item)
    assert queued_result(out, grace_s=0.01) == "measured"
    assert queued_result(out, grace_s=0.01) is None
