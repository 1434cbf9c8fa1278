"""A wrong plan is refused before any collective; a dead or hung rank makes the others fail
within the process-group timeout; a run killed mid-way resumes to the same losses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.executor_helpers import launch, make_plan, spawn_ranks, write_plans

TIMEOUT_S = 8.0
"""Process-group timeout of the dead-rank runs."""
START_S = 30.0
"""Generous bound on start-up (imports, model, process group) on a loaded 2-core machine."""


@pytest.mark.multiprocess
def test_world_size_mismatch_refused_by_every_rank(tmp_path: Path) -> None:
    """Plain processes, not torchrun: torchrun ends the slower rank as soon as the faster one
    exits, so whether the slower one got to write its refusal would be a race."""
    (path,) = write_plans(tmp_path, {"four": make_plan(dp=4)})
    codes, _, err = spawn_ranks(2, "mismatch", tmp_path, path, wait_s=START_S * 2, wait_all=True)
    assert codes == [3, 3], err[-3000:]
    for rank in range(2):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "plan is for 4 ranks" in res["error"] and "world size 2" in res["error"]
        assert "--nproc-per-node=4" in res["error"]
        assert res["initialized"] is False  # refused before the process group existed


@pytest.mark.multiprocess
def test_different_weights_refused(tmp_path: Path) -> None:
    (path,) = write_plans(tmp_path, {"fsdp": make_plan(dp=2, zero=3)})
    proc = launch(2, "mismatch", tmp_path, path, "seed_by_rank", timeout_s=120)
    assert proc.returncode != 0
    res = json.loads((tmp_path / "rank0.json").read_text())
    assert "ranks [1] hold other weights" in res["error"] and "torch.manual_seed" in res["error"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["crash", "hang"])
def test_dead_rank_makes_the_others_fail(tmp_path: Path, mode: str) -> None:
    """Rank 1 exits (crash) or stops answering (hang) in step 3; rank 0, launched without
    torchrun (so nothing else would stop it), must raise and exit non-zero: at once for a
    crash (the peer's socket closes), after the group timeout for a hang."""
    (path,) = write_plans(tmp_path, {"ddp": make_plan(dp=2)})
    codes, elapsed, err = spawn_ranks(
        2, "dead_rank", tmp_path, mode, path, str(TIMEOUT_S), wait_s=START_S + 4 * TIMEOUT_S
    )
    assert codes[0] == 1, err[-3000:]
    res = json.loads((tmp_path / "rank0.json").read_text())
    assert res["error"], res
    if mode == "crash":
        assert codes[1] == 7
        assert res["elapsed_s"] < TIMEOUT_S + 2
    else:
        assert codes[1] is None  # still hanging: the test ended it
        assert TIMEOUT_S - 1 < res["elapsed_s"] < 2 * TIMEOUT_S + 2
        assert "Timed out" in res["error"] or "timeout" in res["error"].lower()
    assert elapsed < START_S + 3 * TIMEOUT_S


@pytest.mark.multiprocess
def test_killed_run_resumes_to_the_same_losses(tmp_path: Path) -> None:
    """FSDP2 ZeRO-3 and a 1F1B pipeline with AdamW: a run saving every 2 steps dies after its
    5th step; a new launch resumes from step 4 and its last two losses equal those of an
    uninterrupted 6-step run."""
    plans = {
        "fsdp3": make_plan(dp=2, zero=3, optimizer="adamw"),
        "pp_1f1b": make_plan(pp=2, schedule="1f1b", nmb=2, mbs=1, optimizer="adamw"),
    }
    paths = write_plans(tmp_path, plans)
    ckpt = tmp_path / "ckpt"
    crashed = launch(2, "resume", tmp_path, "crash", str(ckpt), *paths)
    assert crashed.returncode != 0  # it was killed
    for name in plans:
        assert (ckpt / name / "latest").read_text().strip() == "step-4"
    resumed = launch(2, "resume", tmp_path, "resume", str(ckpt), *paths)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    res = json.loads((tmp_path / "rank0.json").read_text())
    for name in plans:
        r = res[name]
        assert r["resumed_first"] == 4 and len(r["whole"]) == 6
        assert r["resumed"] == pytest.approx(r["whole"][4:], rel=1e-6, abs=1e-6), name
        assert r["whole"][-1] != r["whole"][0]  # the model did train
