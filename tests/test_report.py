"""Reports (`paraplan compare`): a plan's stage times in the pipeline replay, the named
strategies, fixed colours, labelled figures, and a report whose table equals its plan
JSONs. Fast CPU tests on small analytic models (no torch)."""

from __future__ import annotations

import itertools
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from paraplan.api import model_profile
from paraplan.cli import build_parser, main
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.plan_io import load_plan
from paraplan.planner.solvers.pipeline_orders import Phase
from paraplan.report import (
    ReportOptions,
    Status,
    build_report,
    compare_schedules,
    compare_strategies,
    parse_strategies,
    parse_tradeoff,
    simulate_pipeline,
)
from paraplan.report.colors import (
    RUNNER_UP_COLORS,
    STRATEGY_COLORS,
    WEIGHT_GRAD_COLOR,
    schedule_color,
    strategy_color,
)
from paraplan.report.render import COLUMNS, field_value, layout_summary
from paraplan.report.timeline import stage_times

matplotlib = pytest.importorskip("matplotlib")

# A 3.3B-parameter GPT that fits on 8 L4s only sharded: DP + full recompute (ZeRO-1) does not.
MID_MODEL = "gpt:layers=24,hidden=4096,heads=32,vocab=32000,seq=4096"
SMALL_MODEL = "gpt:layers=8,hidden=1024,heads=16,vocab=32000,seq=2048"


def compare(argv: list[str]) -> int:
    """`paraplan compare ARGV` through the command line's entry point."""
    return main(["compare", *argv])


def _inputs(model: str, cluster: str, batch: int, seq: int):
    profile = model_profile(model, seq_len=seq, source="spec")
    return profile, parse_cluster(cluster), TrainConfig(global_batch=batch, seq_len=seq)


@pytest.fixture(scope="module")
def mid_report(tmp_path_factory):
    """A report where one named strategy does not fit (spec model, quick)."""
    profile, cluster, train = _inputs(MID_MODEL, "8xl4", 16, 4096)
    folder = tmp_path_factory.mktemp("mid") / "report"
    result = build_report(folder, profile=profile, cluster=cluster, train=train)
    return result


# ---- the pipeline replay of a plan (the replay itself: test_solvers_pipeline_replay.py) ---
def test_plan_stage_times_reproduce_its_pipeline_time(mid_report) -> None:
    """Replaying a pipelined plan with its own schedule and micro-batches gives back the cost
    model's pipeline: m slots plus its predicted bubble."""
    megatron = next(e for e in mid_report.entries if e.name == "megatron")
    plan = megatron.plan
    assert plan is not None and plan.parallelism.pp > 1
    times = stage_times(plan)
    t = simulate_pipeline(
        plan.schedule,
        num_stages=plan.parallelism.pp,
        num_microbatches=plan.num_microbatches,
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        virtual_stages=plan.parallelism.virtual_stages,
    )
    bubble = t.makespan_s - plan.num_microbatches * times.slot_s
    assert bubble == pytest.approx(plan.predicted.time_breakdown.bubble_s, rel=1e-9)
    assert t.bubble_fraction == pytest.approx(plan.predicted.bubble_fraction, rel=1e-9)
    panels = compare_schedules(plan)
    m, pp = panels[0].num_microbatches, plan.parallelism.pp
    expected = ["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zbv"]
    expected += ["dualpipev"] if m >= 2 * pp else []  # torch's ScheduleDualPipeV rule
    assert [str(x.schedule) for x in panels] == expected
    for t in panels:  # each micro-batch and chunk gets its weight gradient once: a whole
        # backward, or a split one's W after its B (only the split schedules split any)
        count = {ph: sum(x.phase == ph for x in t.intervals) for ph in Phase}
        split = str(t.schedule) in ("interleaved_zb", "zbv", "dualpipev")
        assert (count[Phase.BACKWARD_WEIGHT] > 0) == split
        assert count[Phase.BACKWARD_INPUT] == count[Phase.BACKWARD_WEIGHT]
        whole = count[Phase.BACKWARD] + count[Phase.BACKWARD_WEIGHT]
        assert whole == count[Phase.FORWARD] == pp * t.num_microbatches * t.virtual_stages
        for stage in range(pp):  # no two operations of a stage overlap
            ops = sorted(t.stage_intervals(stage), key=lambda x: x.start_s)
            assert all(a.end_s <= b.start_s + 1e-12 for a, b in itertools.pairwise(ops))


# ---- strategies ----------------------------------------------------------------------------
def test_parse_strategies() -> None:
    assert parse_strategies("plan, FSDP,plan,megatron") == ("plan", "fsdp", "megatron")
    with pytest.raises(ValueError, match=r"unknown strategy 'zero3'.*plan, fsdp, megatron"):
        parse_strategies("plan,zero3")
    with pytest.raises(ValueError, match="empty"):
        parse_strategies(" , ")
    assert parse_tradeoff("none") == ()
    assert parse_tradeoff("sqrt-l,paraplan-dp") == ("sqrt-L", "paraplan-dp")
    with pytest.raises(ValueError, match="unknown strategy 'rotor'"):
        parse_tradeoff("rotor")


def test_named_strategies_pin_what_they_say(mid_report) -> None:
    by = {e.name: e for e in mid_report.entries}
    assert list(by) == [
        "plan",
        "fsdp",
        "megatron",
        "dp-recompute",
        "runner-up-1",
        "runner-up-2",
        "runner-up-3",
    ]
    fsdp = by["fsdp"].plan
    assert fsdp is not None
    assert (fsdp.parallelism.dp, fsdp.parallelism.tp, fsdp.parallelism.pp) == (8, 1, 1)
    assert fsdp.parallelism.zero_stage == 3
    meg = by["megatron"].plan
    assert meg is not None and meg.parallelism.tp == 4 and meg.parallelism.pp == 2
    assert meg.parallelism.sequence_parallel and meg.schedule == "1f1b"
    # ZeRO-1 data parallel replicates 16-bit weights and gradients: 13 GB of a 23 GB L4 budget.
    dpr = by["dp-recompute"]
    assert dpr.status == Status.DOES_NOT_FIT and dpr.plan is None
    main_plan = by["plan"].plan
    assert main_plan is not None and "does not fit" in dpr.reason
    assert dpr.least_memory_bytes is not None
    assert dpr.least_memory_bytes > main_plan.predicted.memory_capacity_bytes
    for k, record in enumerate(main_plan.runners_up, 1):  # re-planned: the same predictions
        got = by[f"runner-up-{k}"].plan
        assert got is not None
        assert got.predicted.step_time_s == pytest.approx(record.step_time_s, rel=1e-12)
        assert got.predicted.mfu == pytest.approx(record.mfu, rel=1e-12)
        assert got.predicted.memory_per_gpu_bytes == pytest.approx(
            record.memory_per_gpu_bytes, rel=1e-12
        )


def test_nothing_fits_is_a_report_not_a_crash(tmp_path: Path, capsys) -> None:
    code = compare(
        [
            "--model",
            "llama3-405b",
            "--model-source",
            "spec",
            "--cluster",
            "8xl4",
            "--global-batch",
            "8",
            "--seq-len",
            "8192",
            "--strategies",
            "plan,fsdp",
            "--tradeoff",
            "none",
            "-o",
            str(tmp_path / "r"),
            "--no-progress",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and "no compared strategy fits" in err
    readme = (tmp_path / "r" / "README.md").read_text()
    assert "does not fit (needs at least" in readme
    assert "smallest per-GPU memory any plan needs" in readme
    assert "does not fit" in out


# ---- colours and figures -------------------------------------------------------------------
def test_colours_are_fixed_and_distinct() -> None:
    compared = ["plan", "fsdp", "megatron", "dp-recompute"] + [f"runner-up-{k}" for k in (1, 2, 3)]
    colours = [strategy_color(n) for n in compared]
    assert len(set(colours)) == len(colours)
    tradeoff = ["store-all", "sqrt-L", "full-recompute", "paraplan-dp", "paraplan-ilp"]
    assert len({strategy_color(n) for n in tradeoff}) == len(tradeoff)
    assert strategy_color("paraplan-dp") == strategy_color("plan")  # the same concept
    assert strategy_color("full-recompute") == strategy_color("dp-recompute")
    assert strategy_color("runner-up-9") == RUNNER_UP_COLORS[-1]
    assert set(tradeoff) <= set(STRATEGY_COLORS)
    with pytest.raises(ValueError, match="no colour for strategy 'zero-bubble'"):
        strategy_color("zero-bubble")
    schedules = [schedule_color(s) for s in ("gpipe", "1f1b", "interleaved_1f1b")]
    assert len(set(schedules)) == 3 and not set(schedules) & set(STRATEGY_COLORS.values())


def _hex(rgba) -> str:
    from matplotlib.colors import to_hex

    return to_hex(rgba).upper()


def test_figures_label_axes_with_units_and_keep_colours(mid_report) -> None:
    from paraplan.planner.solvers.tradeoff import TradeoffCurve, TradeoffPoint
    from paraplan.report.plots import (
        gantt_figure,
        memory_figure,
        time_figure,
        tradeoff_figure,
    )

    entries = mid_report.entries
    context = "gpt on 8xl4, global batch 16 x 4096 tokens"
    for make, unit in ((memory_figure, "(GiB)"), (time_figure, "(s)")):
        fig = make(entries, context=context, source="plans/*.json")
        (ax,) = fig.axes
        assert ax.get_xlabel() == "strategy" and ax.get_ylabel().endswith(unit)
        assert context in ax.get_title()
        ticks = ax.get_xticklabels()
        assert [t.get_text() for t in ticks] == [e.label for e in entries]
        for tick, e in zip(ticks, entries, strict=True):
            assert _hex(tick.get_color()) == strategy_color(e.name)
        edges = {_hex(p.get_edgecolor()) for p in ax.patches}
        assert {strategy_color(e.name) for e in entries if e.fits} <= edges
    megatron = next(e for e in entries if e.name == "megatron")
    assert megatron.plan is not None
    timelines = compare_schedules(megatron.plan)
    fig = gantt_figure(timelines, what="schedules", context=context, source="plans/megatron.json")
    assert len(fig.axes) == len(timelines) >= 5
    for ax, t in zip(fig.axes, timelines, strict=True):
        assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "pipeline stage"
        colours = {schedule_color(str(t.schedule))}
        if any(x.phase == Phase.BACKWARD_WEIGHT for x in t.intervals):
            colours.add(WEIGHT_GRAD_COLOR)  # W boxes apart from F and B
            labels = [x.get_text() for x in ax.get_legend().get_texts()]
            assert labels == ["forward (F)", "input gradient (B)", "weight gradient (W)"]
            # a W box per split backward; ZB1P and ZB-V split every one: p x m x chunks boxes
            # (DualPipeV runs its steady-state backwards whole, overlapped with a forward)
            w_boxes = [p for p in ax.patches if _hex(p.get_facecolor()) == WEIGHT_GRAD_COLOR]
            assert len(w_boxes) == sum(x.phase == Phase.BACKWARD_WEIGHT for x in t.intervals)
            if str(t.schedule) in ("interleaved_zb", "zbv"):
                assert len(w_boxes) == t.num_stages * t.num_microbatches * t.virtual_stages
        assert {_hex(p.get_facecolor()) for p in ax.patches} == colours
    assert context in fig.get_suptitle()
    # Hand-made curves (the shape of planner/solvers/tradeoff.py), one infeasible point.
    curves = [
        TradeoffCurve(
            strategy=name,
            points=(
                TradeoffPoint(
                    budget_bytes=1e9,
                    status="infeasible",
                    makespan_s=None,
                    peak_bytes=None,
                    overhead=None,
                ),
                TradeoffPoint(
                    budget_bytes=2e9,
                    status="optimal",
                    makespan_s=1.3,
                    peak_bytes=1.9e9,
                    overhead=0.3 - k / 10,
                ),
            ),
        )
        for k, name in enumerate(("sqrt-L", "paraplan-dp"))
    ]
    fig = tradeoff_figure(curves, what="checkpointing", context=context, source="data")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "memory budget for activations (GiB)"
    assert ax.get_ylabel() == "time overhead vs store-all (%)"
    assert [_hex(line.get_color()) for line in ax.get_lines()] == [
        strategy_color("sqrt-L"),
        strategy_color("paraplan-dp"),
    ]
    assert list(ax.get_lines()[1].get_ydata()) == pytest.approx([20.0])  # percent


def test_report_folder_and_figures_on_disk(mid_report) -> None:
    from matplotlib.image import imread

    folder = mid_report.folder
    names = [e.name for e in mid_report.entries if e.plan is not None]
    assert set(mid_report.files) == {
        "README.md",
        "report.html",
        "data/schedules.json",
        "data/schedule_compare.json",
        "data/tradeoff.json",
        *(f"plans/{n}.json" for n in names),
        # the pipelined strategy under each schedule (tests/test_schedule_compare.py)
        *(f"schedules/{s}.json" for s in ("1f1b", "interleaved_1f1b", "interleaved_zb")),
        *(f"schedules/{s}.json" for s in ("zbv", "dualpipev")),
        *(
            f"figures/{k}.{ext}"
            for k in ("memory", "time", "gantt", "schedule-compare", "tradeoff")
            for ext in ("png", "svg")
        ),
    }
    for key in ("memory", "time", "gantt", "tradeoff"):
        pixels = imread(folder / "figures" / f"{key}.png")
        assert pixels.shape[0] > 300 and pixels.shape[1] > 800
        assert pixels[..., :3].std() > 0.05  # not blank
        assert (folder / "figures" / f"{key}.svg").read_text().lstrip().startswith("<?xml")
    readme = (folder / "README.md").read_text()
    assert "![Memory per GPU](figures/memory.png)" in readme
    assert "DP + full recompute | does not fit (needs at least" in readme


# ---- the table against the plan JSONs ------------------------------------------------------
class _Cells(HTMLParser):
    """Collects the table cells that carry data-value."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self._open: dict[str, str] | None = None

    def handle_starttag(self, tag, attrs) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "td" and "data-value" in a:
            self._open = a | {"text": ""}

    def handle_data(self, data) -> None:
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag) -> None:
        if tag == "td" and self._open is not None:
            self.cells.append(self._open)
            self._open = None


def table_cells(html_text: str) -> list[dict[str, str]]:
    """The numeric cells of a report's table (also used by test_report_html)."""
    parser = _Cells()
    parser.feed(html_text)
    return parser.cells


def check_table_against_plans(cells: list[dict[str, str]], folder: Path) -> set[str]:
    """Every numeric cell equals its plan JSON's value exactly, and shows it formatted."""
    formats = {c.header: c for c in COLUMNS}
    seen = set()
    for cell in cells:
        data = json.loads((folder / "plans" / f"{cell['data-strategy']}.json").read_text())
        value = field_value(data, cell["data-field"])
        assert float(cell["data-value"]) == value, cell
        col = formats[cell["data-column"]]
        assert col.field == cell["data-field"]
        shown = value * col.scale / (data["cluster"]["num_gpus"] if col.per_gpu else 1)
        assert cell["text"].strip() == col.text(shown)
        seen.add(cell["data-strategy"])
    return seen


def test_html_table_equals_plan_jsons(mid_report) -> None:
    folder = mid_report.folder
    cells = table_cells((folder / "report.html").read_text())
    fitting = {e.name for e in mid_report.entries if e.fits}
    assert check_table_against_plans(cells, folder) == fitting
    assert len(cells) == len(fitting) * len(COLUMNS)
    for e in mid_report.entries:
        if e.plan is not None:
            assert load_plan(folder / "plans" / f"{e.name}.json") == e.plan
            assert layout_summary(e.plan) in (folder / "report.html").read_text()


# ---- the command ---------------------------------------------------------------------------
def test_cli_parser_plugs_into_paraplan() -> None:
    args = build_parser().parse_args(
        ["compare", "--model", "gpt2", "--cluster", "8xh100", "--global-batch", "16K", "-o", "r"]
    )
    assert args.global_batch == 16 * 1024 and args.output == "r"
    assert args.strategies == "plan,fsdp,megatron,dp-recompute,runners-up"


def test_cli_bad_input_exits_2(tmp_path: Path, capsys) -> None:
    base = [
        "--model",
        SMALL_MODEL,
        "--cluster",
        "8xh100",
        "--global-batch",
        "64",
        "--tradeoff",
        "none",
        "--no-progress",
    ]
    assert compare([*base, "--strategies", "plan,zero3", "-o", str(tmp_path / "a")]) == 2
    assert "unknown strategy 'zero3'" in capsys.readouterr().err
    assert compare([*base, "--tradeoff", "rotor", "-o", str(tmp_path / "a")]) == 2
    assert "--tradeoff: unknown strategy 'rotor'" in capsys.readouterr().err
    assert compare([*base, "--cluster", "8xfoo", "-o", str(tmp_path / "a")]) == 2
    assert "paraplan: error:" in capsys.readouterr().err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    assert compare([*base, "-o", str(other)]) == 2
    assert "not replacing it" in capsys.readouterr().err
    assert (other / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "a").exists()


def test_cli_writes_then_replaces_a_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rep"
    argv = [
        "--model",
        SMALL_MODEL,
        "--cluster",
        "8xh100",
        "--global-batch",
        "64",
        "--strategies",
        "plan,megatron",
        "--top",
        "1",
        "--tradeoff",
        "sqrt-L,paraplan-dp",
        "--tradeoff-budgets",
        "3",
        "-o",
        str(out),
        "--no-progress",
    ]
    assert compare(argv) == 0
    first = capsys.readouterr().out
    assert "report written to" in first and "Megatron TP x PP" in first
    assert sorted(p.name for p in (out / "plans").iterdir()) == ["megatron.json", "plan.json"]
    tradeoff = json.loads((out / "data" / "tradeoff.json").read_text())
    assert [c["strategy"] for c in tradeoff["curves"]] == ["sqrt-L", "paraplan-dp"]
    (out / "stale.txt").write_text("from an earlier report")
    again = [
        *argv[: argv.index("--strategies")],
        "--strategies",
        "plan",
        "--top",
        "0",
        "--tradeoff",
        "none",
        "-o",
        str(out),
    ]
    assert compare(again) == 0
    assert not (out / "stale.txt").exists()
    assert [p.name for p in (out / "plans").iterdir()] == ["plan.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no temporary folder left behind


def test_failed_report_leaves_nothing_half_written(tmp_path: Path, monkeypatch) -> None:
    import paraplan.report.plots as plots

    def broken(*args, **kwargs):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(plots, "time_figure", broken)
    profile, cluster, train = _inputs(SMALL_MODEL, "8xh100", 64, 2048)
    options = ReportOptions(strategies=("plan",), top_k=0, tradeoff=())
    with pytest.raises(RuntimeError, match="drawing failed"):
        build_report(tmp_path / "r", profile=profile, cluster=cluster, train=train, options=options)
    assert list(tmp_path.iterdir()) == []


def test_compare_strategies_reports_progress() -> None:
    profile, cluster, train = _inputs(SMALL_MODEL, "8xh100", 64, 2048)
    steps: list[str] = []
    got = compare_strategies(
        profile, cluster, train, names=("fsdp", "runners-up"), top_k=2, on_step=steps.append
    )
    assert [e.name for e in got] == ["fsdp", "runner-up-1", "runner-up-2"]
    assert steps == ["paraplan plan", "pure FSDP", "runner-up #1", "runner-up #2"]
