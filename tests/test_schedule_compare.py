"""The compare report's schedules section: a pipelined plan re-planned under 1F1B, interleaved
1F1B, ZB1P, ZB-V and DualPipeV with its other dimensions pinned; bubbles against the published
formulas, a schedule that cannot run says why, and the report's table equals its plan JSONs.
Fast CPU tests on analytic models (no torch)."""

from __future__ import annotations

import json

import pytest

from paraplan.api import model_profile
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.pins import Pins
from paraplan.planner.plan_io import load_plan
from paraplan.planner.strategy import Schedule
from paraplan.report import ReportOptions, Status, build_report, compare_strategies
from paraplan.report.render import SCHEDULE_COLUMNS, field_value, schedule_plan_path
from paraplan.report.schedules import COMPARED_SCHEDULES, compare_pinned_schedules
from paraplan.report.strategies import _Planner

pytest.importorskip("matplotlib")

MID_MODEL = "gpt:layers=24,hidden=4096,heads=32,vocab=32000,seq=4096"
"""3.3B GPT: the Megatron-style strategy on 8 L4s is tp=4 pp=2, m=16 (tests/test_report.py)."""


def _inputs(model: str, cluster: str, batch: int, seq: int):
    profile = model_profile(model, seq_len=seq, source="spec")
    return profile, parse_cluster(cluster), TrainConfig(global_batch=batch, seq_len=seq)


@pytest.fixture(scope="module")
def megatron():
    profile, cluster, train = _inputs(MID_MODEL, "8xl4", 16, 4096)
    e = compare_strategies(profile, cluster, train, names=("megatron",))[0]
    assert e.fits and e.plan is not None and e.plan.parallelism.pp > 1
    return e, (profile, cluster, train)


def test_pinned_schedules_keep_the_plan_and_match_the_bubble_formulas(megatron) -> None:
    e, inputs = megatron
    base = e.plan
    rows = compare_pinned_schedules(base, *inputs)
    assert [r.name for r in rows] == [f"schedule-{s}" for s in COMPARED_SCHEDULES]
    by = {r.plan.schedule: r.plan for r in rows if r.fits and r.plan is not None}
    assert set(by) == set(COMPARED_SCHEDULES)  # the 3.3B model fits under every schedule
    for plan in by.values():  # only the schedule (and its chunks) changed
        a, b = plan.parallelism, base.parallelism
        assert (a.dp, a.tp, a.pp, a.cp) == (b.dp, b.tp, b.pp, b.cp)
        assert plan.micro_batch_size == base.micro_batch_size
        assert plan.num_microbatches == base.num_microbatches
    p, m = base.parallelism.pp, base.num_microbatches
    # 1F1B is what the Megatron strategy was planned with: the same plan, the same prediction
    assert by[Schedule.ONE_F_ONE_B].predicted.step_time_s == base.predicted.step_time_s
    # Narayanan et al. 2021 §2.2: bubble (p-1)/(m+p-1); interleaved with v chunks: (p-1)/v slots
    one_f_one_b = by[Schedule.ONE_F_ONE_B].predicted.bubble_fraction
    assert one_f_one_b == pytest.approx((p - 1) / (m + p - 1))
    v = by[Schedule.INTERLEAVED_1F1B].parallelism.virtual_stages
    bubble_slots = (p - 1) / v
    assert by[Schedule.INTERLEAVED_1F1B].predicted.bubble_fraction == pytest.approx(
        bubble_slots / (m + bubble_slots)
    )
    # Qi et al. 2023 (ZB1P, ZB-V) and DeepSeek-V3 (DualPipe): less bubble than 1F1B's
    for s in (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV):
        assert by[s].predicted.bubble_fraction < by[Schedule.ONE_F_ONE_B].predicted.bubble_fraction


def test_a_schedule_that_cannot_run_says_why() -> None:
    # 4 blocks on pp=4: a V needs 2 chunks per stage = 8 chunks, more than the 4 blocks
    profile, cluster, train = _inputs("gpt:layers=4,hidden=256,heads=4,vocab=1000", "4xl4", 8, 128)
    pins = Pins(dp=1, tp=1, pp=4, cp=1, schedule=Schedule.ONE_F_ONE_B)
    base = _Planner(profile, cluster, train).run("plan", "plan", pins)
    assert base.fits and base.plan is not None
    rows = {r.name: r for r in compare_pinned_schedules(base.plan, profile, cluster, train)}
    assert rows["schedule-1f1b"].fits
    for name in ("schedule-zbv", "schedule-dualpipev", "schedule-interleaved_1f1b"):
        assert rows[name].status == Status.NOT_VALID and rows[name].plan is None
        assert rows[name].reason  # the rule that refused it


def test_report_schedules_table_equals_its_plan_files(tmp_path) -> None:
    profile, cluster, train = _inputs(MID_MODEL, "8xl4", 16, 4096)
    opts = ReportOptions(strategies=("megatron",), top_k=0, tradeoff=())
    result = build_report(
        tmp_path / "report", profile=profile, cluster=cluster, train=train, options=opts
    )
    folder = result.folder
    data = json.loads((folder / "data" / "schedule_compare.json").read_text())
    names = [x["name"] for x in data["schedules"]]
    assert names == [f"schedule-{s}" for s in COMPARED_SCHEDULES]
    readme = (folder / "README.md").read_text()
    html = (folder / "report.html").read_text()
    assert "## Pipeline schedules compared" in readme
    assert "figures/schedule-compare.png" in readme
    for name in names:
        plan = load_plan(folder / schedule_plan_path(name))
        assert plan.schedule == Schedule(name.removeprefix("schedule-"))
        raw = json.loads((folder / schedule_plan_path(name)).read_text())
        for c in SCHEDULE_COLUMNS:
            value = float(field_value(raw, c.field))
            cell = f'data-schedule="{name}" data-field="{c.field}" data-schedule-value="{value!r}"'
            assert cell in html
            assert c.text(value * c.scale) in readme
