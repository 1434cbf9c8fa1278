"""Issue 16's output figures: achieved TFLOP/s and tokens/s per GPU next to MFU (plan, explain,
compare, report), plans written before the TFLOP/s field still load, and `compare` says why a
baseline is not valid or does not fit (a batch that does not divide names the batches that do)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan
from paraplan.api import model_profile
from paraplan.cli import main
from paraplan.cli.compare import summary
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.explain import explain, format_plan, model_flops_per_s_per_gpu
from paraplan.planner.hardware import get_accelerator
from paraplan.planner.plan_io import load_plan, save_plan
from paraplan.report import ReportResult
from paraplan.report.render import COLUMNS, ReportContent, render_markdown
from paraplan.report.strategies import Status, compare_strategies

SPEC = "gpt:layers=4,hidden=256,heads=4,vocab=1024,seq=128"
H100_BF16_FLOPS = get_accelerator("h100").peak_flops_for("bf16")


@pytest.fixture(scope="module")
def plan() -> paraplan.Plan:
    return paraplan.plan(SPEC, "8xh100", global_batch=64, top_k=3).plan


def test_tflops_per_gpu_is_mfu_times_the_catalog_peak(plan: paraplan.Plan) -> None:
    pr = plan.predicted
    rate = pr.model_flops_per_s_per_gpu
    assert rate is not None and rate == pytest.approx(pr.mfu * H100_BF16_FLOPS, rel=1e-12)
    text = format_plan(plan)
    assert f"MFU {pr.mfu:.1%} ({rate / 1e12:,.1f} TFLOP/s per GPU)" in text
    assert f"({pr.tokens_per_s / 8:,.0f} per GPU)" in text
    said = explain(plan)
    assert f"({rate / 1e12:,.1f} of the {H100_BF16_FLOPS / 1e12:,.1f} TFLOP/s peak per GPU)" in said
    assert f"{pr.tokens_per_s / 8:,.0f} tokens/s per GPU" in said


def test_runners_up_tflops_follow_their_own_mfu(plan: paraplan.Plan) -> None:
    assert plan.runners_up
    rows = format_plan(plan).split("Runners-up")[1]
    assert "TFLOP/s/GPU" in rows
    for r in plan.runners_up:
        rate = model_flops_per_s_per_gpu(plan, r.step_time_s)
        assert rate == pytest.approx(r.mfu * H100_BF16_FLOPS, rel=1e-9)


def test_runners_up_columns_line_up_whatever_the_strategy_names() -> None:
    # gpt3-175b's top 5 on 1024 A100s names an interleaved schedule, longer than the others:
    # every row's step time still ends in the header's column
    out = paraplan.plan(
        "gpt3-175b", "1024xa100-80gb", global_batch=1536, seq_len=2048, top_k=5
    ).plan
    table = format_plan(out).split("Runners-up")[1].splitlines()
    header = next(line for line in table if "step s" in line)
    end = header.index("step s") + len("step s")
    rows = [line for line in table if line.strip()[:1].isdigit()]
    assert len(rows) >= 3
    assert max(len(r.strategy().short()) for r in out.runners_up) > 56  # the case this tests
    for line in rows:
        assert line[end - 1].isdigit() and line[end] == " ", line


def test_a_version_5_plan_loads_with_no_tflops(plan: paraplan.Plan, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_plan(plan, path)
    doc = json.loads(path.read_text())
    doc["schema_version"] = 5  # as paraplan wrote it before the field
    del doc["predicted"]["model_flops_per_s_per_gpu"]
    path.write_text(json.dumps(doc))
    old = load_plan(path)
    assert old.predicted.model_flops_per_s_per_gpu is None
    assert "(- TFLOP/s per GPU)" in format_plan(old)
    assert "(- TFLOP/s per GPU)" in explain(old)


def _compared(batch: int) -> ReportResult:
    profile = model_profile(SPEC, seq_len=None, source="spec")
    train = TrainConfig(global_batch=batch, seq_len=profile.seq_len)
    entries = compare_strategies(
        profile, parse_cluster("8xh100"), train, names=("plan", "fsdp", "dp-recompute"), top_k=0
    )
    return ReportResult(folder=Path("r"), entries=entries, files=(), notes=())


def test_compare_summary_shows_per_gpu_figures_and_why_a_batch_does_not_divide() -> None:
    result = _compared(12)
    plan, fsdp, dpr = result.entries
    assert plan.fits and fsdp.status == dpr.status == Status.NOT_VALID
    for e in (fsdp, dpr):
        assert "global batch of 12 sequences does not split into 8 equal shares" in e.reason
        assert "--global-batch 8 or 16" in e.reason
    text = summary(result)
    assert "TFLOP/s/GPU" in text and "tok/s/GPU" in text
    assert plan.plan is not None
    pr = plan.plan.predicted
    assert pr.model_flops_per_s_per_gpu is not None
    assert f"{pr.model_flops_per_s_per_gpu / 1e12:,.1f}" in text
    assert f"{pr.tokens_per_s / 8:,.0f}" in text
    joined = " ".join(text.split())  # the reasons are wrapped over lines
    assert joined.count("why: it makes each of the 8 GPUs a data-parallel rank (dp=8)") == 2
    assert "--global-batch 8 or 16" in joined


def test_compare_summary_says_why_a_strategy_does_not_fit() -> None:
    profile = model_profile("llama3-70b", seq_len=4096, source="spec")
    train = TrainConfig(global_batch=16, seq_len=4096)
    entries = compare_strategies(
        profile, parse_cluster("8xa100-40gb"), train, names=("fsdp",), top_k=0
    )
    (fsdp,) = entries
    assert fsdp.status == Status.DOES_NOT_FIT and fsdp.least_memory_bytes is not None
    text = summary(ReportResult(folder=Path("r"), entries=entries, files=(), notes=()))
    assert "does not fit (needs at least " in text
    assert "why: llama3-70b does not fit on 8xa100-40gb" in " ".join(text.split())


def test_report_table_has_per_gpu_columns(plan: paraplan.Plan) -> None:
    headers = [c.header for c in COLUMNS]
    assert headers.index("tokens/s per GPU") == headers.index("tokens/s") + 1
    assert headers.index("TFLOP/s per GPU") == headers.index("MFU (%)") + 1
    data = plan.to_dict()
    shown = {c.header: c.shown(data) for c in COLUMNS}
    pr = plan.predicted
    assert pr.model_flops_per_s_per_gpu is not None
    assert shown["TFLOP/s per GPU"] == f"{pr.model_flops_per_s_per_gpu / 1e12:,.1f}"
    assert shown["tokens/s per GPU"] == f"{pr.tokens_per_s / 8:,.0f}"
    result = _compared(12)
    md = render_markdown(
        ReportContent(
            title="t", context="c", entries=result.entries, figures=(), notes=(), generator="g"
        )
    )
    assert "| tokens/s per GPU | MFU (%) | TFLOP/s per GPU |" in md
    assert "does not split into 8 equal shares" in md


def test_from_config_table_has_per_gpu_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ds.json"
    config.write_text(
        '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": true}}'
    )  # bf16: MFU against the bf16 peak (an fp32 config is measured against the fp32 one)
    argv = ["plan", "--from-config", str(config), "--model", SPEC, "--cluster", "8xh100"]
    assert main([*argv, "--no-progress"]) == 0
    rows = {line[:18].strip(): line[18:].split() for line in capsys.readouterr().out.splitlines()}
    total = [float(x.replace(",", "")) for x in rows["tokens/s"]]
    per_gpu = [float(x.replace(",", "")) for x in rows["per GPU"]]
    assert per_gpu == pytest.approx([t / 8 for t in total], abs=0.5)
    mfu = [float(x.rstrip("%")) / 100 for x in rows["MFU"]]
    tflops = [float(x) for x in rows["TFLOP/s/GPU"]]
    half_units = 0.0005 * H100_BF16_FLOPS / 1e12 + 0.05  # MFU shown to 0.1%, TFLOP/s to 0.1
    assert tflops == pytest.approx([m * H100_BF16_FLOPS / 1e12 for m in mfu], abs=half_units)
