"""`executor.partial_grads`: pending (Partial) gradients of replicated DTensor parameters, the
norms' under sequence parallelism, reduced once per group before the optimizer step. Checked
on 2 gloo ranks against DTensor's own reduction (`full_tensor`) and against an AdamW step
that lets DTensor reduce lazily."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reduced_once_equals_dtensor(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(ROOT / "tests" / "scripts" / "partial_grads_rank.py"), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert all("Partial(sum)" in p for p in r["placements_before"]), r
    assert all(p == "(Replicate(),)" for p in r["placements_after"]), r
    assert r["collectives"] == 2  # one per dtype (fp32: two tensors flattened together; fp64)
    assert r["grads_equal"] and r["params_equal"], r
    assert r["again"] == 0  # nothing pending after the reduction
