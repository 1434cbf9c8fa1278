"""Autocast's weight casts under a pipeline: the executor runs a pipeline's whole
`schedule.step` inside one `torch.autocast` context (`executor/compose.py`), whose cache keeps
each weight's cast until the context exits, so the weights are cast once per step; without a
pipeline each micro-batch opens its own context and casts again
(`planner/cost/mixed_precision.autocast_s`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from paraplan.api import model_profile
from paraplan.planner.cluster import load_cluster_file
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.mixed_precision import autocast_s
from paraplan.planner.strategy import Schedule, Strategy

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "docs" / "gpu-h200-2026-11-26" / "calibration-call4.yaml"


def _weight_casts(micro_batches: int, one_context: bool) -> int:
    """`aten::_to_copy` calls of a bf16 autocast forward+backward of one Linear over
    `micro_batches` inputs, in one context or one per micro-batch (backward outside)."""
    lin = torch.nn.Linear(64, 64)
    xs = [torch.randn(4, 64) for _ in range(micro_batches)]
    with profile() as prof:
        if one_context:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for x in xs:
                    lin(x).float().sum().backward()
        else:
            for x in xs:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = lin(x).float().sum()
                out.backward()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")


def test_one_context_casts_the_weights_once() -> None:
    # per micro-batch both ways: the input's cast, the output's, the two gradients' casts
    # back to fp32; in one context the weight and bias are cast only for the first
    for m in (2, 4):
        assert _weight_casts(m, False) - _weight_casts(m, True) == 2 * (m - 1)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_a_pipeline_prices_the_weight_casts_once_per_step(m: int) -> None:
    prof = model_profile(str(ROOT / "examples/configs/gpt2-tiny.json"), seq_len=128,
                         precision="bf16")  # fmt: skip
    cluster = load_cluster_file(CALIBRATION)

    def casts(s: Strategy, batch: int) -> tuple[float, float]:
        ev = Evaluator(prof, cluster, TrainConfig(global_batch=batch, seq_len=128))
        stage = ev.stage_model.stages(ev.stage_model.layout_of(s))[0]
        return autocast_s(s, stage, ev.stage_model)

    pp = Strategy(dp=1, tp=1, pp=2, schedule=Schedule.ONE_F_ONE_B, micro_batch_size=1)
    one_f, one_b = casts(pp, 1)
    many_f, many_b = casts(pp, m)
    assert one_f > 0 and many_f == pytest.approx(one_f / m, rel=1e-12)
    assert many_b == pytest.approx(one_b, rel=1e-12)
    single = Strategy(dp=1, tp=1, pp=1, micro_batch_size=1)  # a context per micro-batch
    assert casts(single, m)[0] == pytest.approx(casts(single, 1)[0], rel=1e-12)
