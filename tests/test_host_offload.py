"""On a cluster of CPUs the devices are the host: the planner offers no offload there (it
would only add copies, and the executor would wrap a single rank in FSDP2's CPU offload), and
refuses a pinned one with exit status 2 before searching."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import paraplan
from paraplan.planner.cluster import parse_cluster

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "configs" / "gpt2-tiny.json")
PINS = (  # the closed loop's strategies (benchmarks/bench_calibration.py), zero left free
    "dp=2,tp=1,pp=1,zero=3,mbs=4,recompute=none",
    "dp=1,tp=2,pp=1,sp=true,mbs=8,recompute=none",
    "dp=1,tp=1,pp=2,schedule=1f1b,mbs=2,recompute=none",
    "",
)


@pytest.mark.parametrize("fix", PINS)
def test_cpu_plans_never_offload(fix: str) -> None:
    prof = paraplan.model_profile(TINY, seq_len=128, precision="fp32")
    outcome = paraplan.plan(
        prof, "2xcpu", global_batch=8, precision="fp32", fix=fix or None, top_k=5
    )
    for s in [outcome.plan.parallelism, *(r.parallelism for r in outcome.plan.runners_up)]:
        assert not (s.offload_optimizer or s.offload_params or s.offload_activations), s


def test_gpu_clusters_still_offer_offload() -> None:
    assert not parse_cluster("8xh100").accelerator.is_host
    assert parse_cluster("2xcpu").accelerator.is_host


@pytest.mark.parametrize("fix", ["offload=true,zero=1", "offload_acts=true"])
def test_pinned_offload_on_cpu_is_refused(fix: str) -> None:
    cmd = [sys.executable, "-m", "paraplan", "plan", "--model", TINY, "--cluster", "2xcpu"]
    cmd += ["--global-batch", "8", "--seq-len", "64", "--fix", fix, "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert "no separate host memory" in done.stderr and "Traceback" not in done.stderr
