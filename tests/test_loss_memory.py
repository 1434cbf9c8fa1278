"""The head's transient under torch's cross-entropy (`cost/memory.layer_tmp_bytes`): the
logits-sized buffers its backward holds at its peak, measured on 2 gloo ranks with the
executor's own loss, plain and under `loss_parallel`, against the constants the cost model
prices (the head's kept bytes count the log-probabilities; the constants the rest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.planner.cost.memory import LOSS_BACKWARD_BUFFERS, LOSS_PARALLEL_BACKWARD_BUFFERS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "loss_peak_rank.py"


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    out = tmp_path_factory.mktemp("loss") / "peak.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*cmd, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("kind", "buffers"),
    [("plain", LOSS_BACKWARD_BUFFERS), ("parallel", LOSS_PARALLEL_BACKWARD_BUFFERS)],
)
def test_loss_peak_is_the_kept_log_probs_plus_the_priced_buffers(
    measured: dict[str, float], kind: str, buffers: int
) -> None:
    logits = measured["logits"]
    in_buffers = measured[kind] / logits
    # within a quarter buffer: the labels, the hidden input's gradient and the head's weight
    # gradient are a few percent of one 8 MiB shard
    assert abs(in_buffers - (1 + buffers)) < 0.25, (kind, in_buffers)


def test_loss_parallel_holds_one_buffer_more_than_the_plain_loss(
    measured: dict[str, float],
) -> None:
    extra = (measured["parallel"] - measured["plain"]) / measured["logits"]
    assert abs(extra - (LOSS_PARALLEL_BACKWARD_BUFFERS - LOSS_BACKWARD_BUFFERS)) < 0.25, extra
