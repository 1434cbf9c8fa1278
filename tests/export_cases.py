"""Plans the export tests round-trip (one per feature the issue names), made with `--fix`
pins on the analytic Llama 3 8B, and the trainers' loaders run in a child process."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import paraplan
from paraplan.planner.model import ModelProfile
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan import Plan

MODEL = "llama3-8b"
SEQ = 4096
CASES: dict[str, tuple[str, int, str]] = {
    "fsdp": ("16xh100", 64, "dp=16,tp=1,pp=1,zero=3,mbs=1,recompute=full,schedule=none"),
    "hsdp": (
        "16xh100",
        64,
        "dp=16,dp_shard=8,tp=1,pp=1,zero=3,mbs=1,recompute=selective,schedule=none",
    ),
    "tp_sp": ("16xh100", 64, "dp=4,tp=4,sp=true,pp=1,zero=2,mbs=2,recompute=none,schedule=none"),
    "pp_1f1b": ("16xh100", 64, "dp=2,tp=2,pp=4,zero=1,mbs=1,schedule=1f1b,recompute=full"),
    "pp_interleaved": (
        "16xh100",
        64,
        "dp=2,tp=2,pp=4,vpp=2,schedule=interleaved_1f1b,zero=1,mbs=1,recompute=selective",
    ),
    "cp": ("16xh100", 64, "dp=4,cp=2,tp=2,pp=1,zero=3,mbs=1,recompute=full,schedule=none"),
    # 80 GB: the nearest configurations without offload must fit (the loss's fp32 logits
    # buffers, 2 GiB each at 128k vocabulary x 4096 tokens, priced since 2026-11-25)
    "zero1_offload": (
        "8xa100-80gb",
        32,
        "dp=8,tp=1,pp=1,zero=1,offload=true,mbs=1,recompute=full,schedule=none",
    ),
    "zero2_offload": (
        "8xa100-80gb",
        32,
        "dp=8,tp=1,pp=1,zero=2,offload=true,mbs=1,recompute=full,schedule=none",
    ),
    "per_layer": (
        "8xa100-40gb",
        32,
        "dp=8,tp=1,pp=1,zero=3,mbs=2,recompute=per_layer,schedule=none",
    ),
    # issue 17: a zero-bubble V schedule, parameter offload, and the options that change the
    # training math (PowerSGD, the async pipeline) with activation offload
    "zbv": ("16xh100", 64, "dp=2,tp=2,pp=4,vpp=2,schedule=zbv,zero=1,mbs=1,recompute=selective"),
    "offload_params": (
        "8xa100-80gb",
        32,
        "dp=8,tp=1,pp=1,zero=3,offload=true,offload_params=true,mbs=1,recompute=none,schedule=none",
    ),
    "options": (
        "16xh100",
        64,
        "dp=4,tp=1,pp=4,zero=1,powersgd=4,async=true,offload_acts=true,schedule=1f1b,mbs=1,"
        "recompute=none",
    ),
}
"""name -> (cluster, global batch, --fix pins)."""
LOADERS = Path(__file__).with_name("export_loaders.py")


@functools.cache
def profile() -> ModelProfile:
    """The analytic Llama 3 8B at `SEQ` (no tracing: fast, no torch)."""
    return parse_model(MODEL).to_profile(SEQ, act_bytes=2)


@functools.cache
def case_plan(name: str) -> Plan:
    """The plan of a case (cached: plans are immutable)."""
    cluster, batch, fix = CASES[name]
    outcome = paraplan.plan(
        profile(), cluster, global_batch=batch, seq_len=SEQ, fix=fix, top_k=0, any_engine=True
    )
    return outcome.plan


def run_loaders(target: str, manifest: list[dict]) -> list[dict]:
    """Run the trainer's own loader on every file of `manifest` in a child process (the
    trainers set up logging and, for DeepSpeed, a process group); its verdicts."""
    proc = subprocess.run(
        [sys.executable, str(LOADERS), target],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode:
        raise AssertionError(f"{target} loaders failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    verdicts: list[dict] = json.loads(proc.stdout.strip().splitlines()[-1])
    return verdicts


def yours_of(path: Path, cluster_name: str = "16xh100", global_batch: int = 64) -> Plan:
    """`--from-config` of a Megatron configuration file on Llama 3 8B at `SEQ`, priced for
    Megatron's runtime: your configuration's plan."""
    from paraplan.export.judge import compare, read_config
    from paraplan.planner.cluster import parse_cluster
    from paraplan.planner.config import TrainConfig
    from paraplan.planner.frameworks import RUNTIMES, Framework

    cluster = parse_cluster(cluster_name)
    setup = read_config(str(path), world_size=cluster.num_gpus)
    train = TrainConfig(
        global_batch=global_batch,
        seq_len=SEQ,
        precision=setup.precision,
        runtime=RUNTIMES[Framework.MEGATRON],
    )
    return compare(str(path), setup, profile(), cluster, train, top_k=0).yours
