"""paraplan.auto_parallelize: profile -> plan -> parallelize inside torchrun, on 2 CPU ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multiprocess
def test_auto_parallelize_two_ranks(tmp_path: Path) -> None:
    from paraplan.executor import causal_lm_loss
    from paraplan.profiler.hf import build_model, load_config

    out = tmp_path / "auto.json"
    script = ROOT / "tests" / "scripts" / "auto_parallelize_gpt2.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    plan = result["plan"]
    assert plan["cluster"]["num_gpus"] == 2 and plan["cluster"]["accelerator"] == "cpu"
    p = plan["parallelism"]
    assert p["dp"] * p["tp"] * p["pp"] == 2 and p["cp"] == p["ep"] == 1
    # The loss of the whole batch equals a single-process reference of the same model.
    spec = __import__("tests.scripts.auto_parallelize_gpt2", fromlist=["CONFIG"])
    torch.manual_seed(0)
    model = build_model(load_config(spec.CONFIG), device="cpu")
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = float(causal_lm_loss(model(input_ids=ids).logits, ids))
    losses = [x for x in result["losses"] if x is not None]
    assert losses
    assert sum(losses) / len(losses) == pytest.approx(reference, rel=1e-4)
