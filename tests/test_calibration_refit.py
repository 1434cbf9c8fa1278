"""`paraplan calibrate --from-run` part by part (`planner/calibration_refit.py`): reports whose
strategies share compute, communication and the optimizer differently pin a scale for each,
the refitted calibration carries each to the cost model's terms, and reports that cannot tell
the parts apart (one report; reports from before the parts were written) keep one scale."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

import paraplan
from paraplan.planner.calibration import Calibration
from paraplan.planner.calibration_refit import (
    PredictedParts,
    RunSample,
    fit_scales,
    refit,
    refit_errors,
    run_sample,
)
from paraplan.planner.cluster import cluster_from_dict
from paraplan.planner.model import ModelProfile
from tests.test_calibration import ROOT, _calibration, _cluster_dict

STRATEGIES = (
    "dp=2,tp=1,pp=1,zero=0,mbs=4,recompute=none",
    "dp=2,tp=1,pp=1,zero=3,mbs=4,recompute=none",
    "dp=1,tp=2,pp=1,sp=true,mbs=8,recompute=none",
    "dp=1,tp=1,pp=2,schedule=1f1b,mbs=2,recompute=none",
)
"""The closed loop's 2-rank strategies (`benchmarks/bench_calibration.py`)."""
TRUE = {"compute": 1.3, "comm": 2.0, "optimizer": 0.6}
"""The machine of the synthetic reports: kernels 30% slower than calibrated, links twice as
slow, the optimizer step faster."""


def _slow_links() -> Calibration:
    """The test calibration with links slow enough (200 MB/s, 0.5 ms per step) that its
    strategies' communication shares differ widely."""
    cal = _calibration()
    figures = {**cal.figures, "intra_node_bw_bytes_per_s": 2e8, "intra_node_latency_s": 5e-4}
    return dataclasses.replace(cal, figures=figures)


@functools.cache
def _profile() -> ModelProfile:
    config = ROOT / "examples" / "configs" / "gpt2-tiny.json"
    return paraplan.model_profile(str(config), seq_len=64, precision="fp32")


def _plans(cluster: object, strategies: tuple[str, ...] = STRATEGIES) -> list:
    return [
        paraplan.plan(_profile(), cluster, global_batch=8, precision="fp32", fix=pins, top_k=0).plan
        for pins in strategies
    ]


def _report(plan: object, measured_s: float) -> dict:
    """A run report as `executor/report.py` writes it, for `plan` measured at `measured_s`."""
    pred = plan.predicted  # type: ignore[attr-defined]
    return {
        "step_time_s": measured_s,
        "predicted_step_time_s": pred.step_time_s,
        "peak_memory_bytes": [pred.memory_per_gpu_bytes],
        "predicted_memory_per_gpu_bytes": pred.memory_per_gpu_bytes,
        "predicted_time_breakdown": dataclasses.asdict(pred.time_breakdown),
    }


def _measured(plan: object) -> float:
    tb = plan.predicted.time_breakdown  # type: ignore[attr-defined]
    compute = tb.compute_s + tb.recompute_s + tb.bubble_s
    return TRUE["compute"] * compute + TRUE["comm"] * tb.comm_s + TRUE["optimizer"] * tb.optimizer_s


def test_parts_refit_recovers_each_scale_and_reaches_the_terms() -> None:
    """Reports of four strategies measured on a machine that differs from the calibration part
    by part (`TRUE`): the compute and communication scales come out within 10% and 15% of the
    machine's (the optimizer, 3-9% of every step, stays near the common scale, as `RIDGE`
    wants of a part the reports barely show), the reports' mean error falls to under half of
    what the best common scale leaves, and the strategies planned again on the refitted
    calibration predict what the scales say within 1% (every term reached)."""
    cal = _slow_links()
    cluster = cluster_from_dict(_cluster_dict(cal))
    plans = _plans(cluster)
    shares = [p.predicted.time_breakdown.comm_s / p.predicted.step_time_s for p in plans]
    assert max(shares) - min(shares) > 0.2  # the strategies communicate in different shares
    samples = [run_sample(_report(p, _measured(p)), origin="r") for p in plans]
    assert all(s.parts is not None for s in samples)
    scales = fit_scales(samples)
    common = fit_scales([dataclasses.replace(s, parts=None) for s in samples])
    assert common.comm == common.compute == common.optimizer
    assert scales.compute == pytest.approx(TRUE["compute"], rel=0.10), scales
    assert scales.comm == pytest.approx(TRUE["comm"], rel=0.15), scales
    assert TRUE["optimizer"] < scales.optimizer < common.compute
    before, after = refit_errors(samples, scales)
    assert after < refit_errors(samples, common)[1] / 2 < before
    new, _ = refit(cal, samples, accelerator="cpu")
    again = _plans(cluster_from_dict(_cluster_dict(new)))
    for plan, sample in zip(again, samples, strict=True):
        assert plan.predicted.step_time_s == pytest.approx(scales.predict_s(sample), rel=0.01)


def test_one_report_or_reports_without_parts_keep_one_scale(tmp_path: Path) -> None:
    """One report cannot tell the parts apart: every scale is the common one (its measured
    over predicted), so the refit matches that run exactly; a report from before the parts
    were written reads without them."""
    cal = _calibration()
    plan = _plans(cluster_from_dict(_cluster_dict(cal)), STRATEGIES[1:2])[0]
    sample = run_sample(_report(plan, 1.7 * plan.predicted.step_time_s), origin="r")
    scales = fit_scales([sample])
    assert scales.compute == pytest.approx(1.7)
    assert scales.comm == pytest.approx(1.7) and scales.optimizer == pytest.approx(1.7)
    old = _report(plan, 1.0)
    del old["predicted_time_breakdown"]
    assert run_sample(old, origin="r").parts is None
    bad = _report(plan, 1.0)
    bad["predicted_time_breakdown"]["comm_s"] = -1.0
    with pytest.raises(ValueError, match="not a run report"):
        run_sample(bad, origin="r")


def test_scales_stay_near_the_common_one() -> None:
    """A part no report exercises (no optimizer step anywhere) keeps the common scale, and a
    part pinned by reports stays within `SCALE_RANGE` of it."""
    samples = [
        RunSample(
            step_time_s=2.0 * (c + m),
            predicted_step_time_s=c + m,
            peak_memory_bytes=1.0,
            predicted_memory_bytes=1.0,
            parts=PredictedParts(compute_s=c, comm_s=m, optimizer_s=0.0),
        )
        for c, m in ((1.0, 0.1), (1.0, 1.0), (0.2, 1.0))
    ]
    scales = fit_scales(samples)
    assert scales.optimizer == pytest.approx(2.0)
    assert scales.compute == pytest.approx(2.0, rel=1e-6) and scales.comm == pytest.approx(2.0)


def test_the_executor_report_writes_the_parts() -> None:
    """`executor/report.make_report` keeps the plan's breakdown, and its JSON is what the
    refit reads."""
    from paraplan.executor.report import make_report

    plan = _plans(cluster_from_dict(_cluster_dict(_calibration())), STRATEGIES[:1])[0]
    report = make_report(
        plan,
        step_times_s=[0.1, 0.2],
        warmup_steps=1,
        memory_bytes=[1e8, 1e8],
        memory_source="test",
        device="cpu",
        first_step=0,
        losses=[1.0],
    )
    sample = run_sample(json.loads(json.dumps(report.to_dict())), origin="r")
    tb = plan.predicted.time_breakdown
    assert sample.parts == PredictedParts(
        compute_s=tb.compute_s + tb.recompute_s + tb.bubble_s,
        comm_s=tb.comm_s,
        optimizer_s=tb.optimizer_s,
    )
