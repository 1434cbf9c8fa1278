"""Under the executor's autocast the residual stream stays fp32 (`cost/mixed_precision.
residual_widening`): measured on 2 gloo ranks, one executor step of the tiny GPT-2 under TP 2
with sequence parallelism in bf16 gathers the norms' fp32 outputs and scatters the matmuls'
bf16 ones, and the cost model's TP communication grows by what those fp32 bytes add."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from paraplan.api import model_profile
from paraplan.planner.cluster import load_cluster_file
from paraplan.planner.config import Precision, TrainConfig
from paraplan.planner.cost import stage_core as stage_core_module
from paraplan.planner.cost.calibrated import CalibratedKernels
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model import ModelProfile
from paraplan.planner.strategy import Strategy
from tests.executor_plans import LAYERS, SEQ_LEN, tiny_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "tp_collective_dtypes.py"
CALIBRATION = ROOT / "docs" / "gpu-h200-2026-11-26" / "calibration-call4.yaml"
MBS = 2  # the script's micro-batch
STRATEGY = Strategy(dp=1, tp=2, pp=1, sequence_parallel=True, micro_batch_size=MBS)


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, int]]:
    out = tmp_path_factory.mktemp("tp") / "collectives.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*cmd, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [(op, dtype, nbytes) for op, dtype, nbytes in json.loads(out.read_text())]


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    """The script's model, traced."""
    config = tmp_path_factory.mktemp("tiny") / "config.json"
    tiny_model("gpt2").config.to_json_file(config)
    return model_profile(str(config), seq_len=SEQ_LEN, precision="bf16")


def _evaluator(profile: ModelProfile) -> Evaluator:
    """A fresh evaluator (its stage cores are memoized: a patched term needs a new one)."""
    train = TrainConfig(global_batch=MBS, seq_len=SEQ_LEN, precision=Precision.BF16)
    return Evaluator(profile, load_cluster_file(CALIBRATION), train)


def _tp_comm_s(profile: ModelProfile) -> float:
    """The priced TP communication of the script's step (one stage: all of it is TP's)."""
    ev = _evaluator(profile)
    (core,) = ev.stage_core(STRATEGY, ev.links(STRATEGY), ev.coll)
    return core.comm_s


def test_norm_outputs_are_gathered_in_fp32_and_matmul_outputs_scattered_in_bf16(
    issued: list[tuple[str, str, int]],
) -> None:
    count = Counter((op, dtype) for op, dtype, _ in issued)
    pairs = 2 * LAYERS  # attention and MLP of every block
    # forward: each norm's output (fp32) all-gathered, each row-parallel output (bf16)
    # reduce-scattered; backward the reverse, in the gradients' dtypes
    assert count["reduce_scatter_tensor", "bfloat16"] == pairs
    assert count["reduce_scatter_tensor", "float32"] == pairs
    assert count["all_gather_into_tensor", "bfloat16"] == pairs
    assert count["all_gather_into_tensor", "float32"] >= pairs  # and the head's input
    fp32 = {n for op, dtype, n in issued if dtype == "float32" and op != "cat"}
    bf16 = {n for op, dtype, n in issued if dtype == "bfloat16" and op != "cat"}
    assert fp32 == {2 * n for n in bf16}  # the same activations, twice the bytes


def test_priced_tp_communication_grows_by_the_fp32_bytes(
    issued: list[tuple[str, str, int]],
    monkeypatch: pytest.MonkeyPatch,
    profile: ModelProfile,
) -> None:
    monkeypatch.setattr(stage_core_module, "SP_LAYOUT_PASSES", 0)  # the copies: below
    widened = _tp_comm_s(profile)
    monkeypatch.setattr(stage_core_module, "residual_widening", lambda s, sm: 1.0)
    narrow = _tp_comm_s(profile)
    # the measured collectives priced as issued, less priced as if every one carried bf16
    ev = _evaluator(profile)
    coll, link = ev.coll, ev.links(STRATEGY).tp
    price = {
        "all_gather_into_tensor": coll.all_gather,
        "reduce_scatter_tensor": coll.reduce_scatter,
        "all_reduce": coll.all_reduce,
    }
    extra = sum(
        price[op](n, link) - price[op](n / 2, link)
        for op, dtype, n in issued
        if dtype == "float32" and op in price
    )
    assert extra > 0
    # the model counts the embedding's and head's collectives as a gather and a scatter
    # each, where the executor all-reduces one of them: within a tenth
    assert widened - narrow == pytest.approx(extra, rel=0.1)


def test_every_sequence_parallel_collective_copies_the_whole_tensor(
    issued: list[tuple[str, str, int]],
) -> None:
    # torch's functional collectives gather and scatter through dim 0: a micro-batch of two
    # sequences is re-laid out by a `torch.cat` of the whole tensor at each of them
    sp = Counter((d, n) for op, d, n in issued if op.startswith(("all_gather", "reduce_scatter")))
    cats = Counter((d, n) for op, d, n in issued if op == "cat")
    assert sp and all(cats[key] == count for key, count in sp.items()), (sp, cats)


def test_priced_layout_copies_match_the_concatenations(
    issued: list[tuple[str, str, int]],
    monkeypatch: pytest.MonkeyPatch,
    profile: ModelProfile,
) -> None:
    with_copies = _tp_comm_s(profile)
    monkeypatch.setattr(stage_core_module, "SP_LAYOUT_PASSES", 0)
    without = _tp_comm_s(profile)
    k = _evaluator(profile).stage_model.kernels
    assert isinstance(k, CalibratedKernels)
    # each concatenation a read and a write of its output, streamed as the model streams
    measured = sum(k.stream_s(2 * n, n) for op, _, n in issued if op == "cat" and n > 4096)
    assert measured > 0
    # the model also copies around the embedding's output scatter and the head's input
    # gradient, which the executor all-reduces: two of 36 copies more, within a sixth
    assert with_copies - without == pytest.approx(measured, rel=1 / 6)
