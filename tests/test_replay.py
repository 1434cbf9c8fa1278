"""The replay of a strategy (every operation of the pipeline schedule on every stage) against
the closed form the search ranks by: the same peak memory, and a step time within one pipeline
bubble, equal when the stages are alike."""

from __future__ import annotations

import itertools
import json

import pytest

from paraplan.cli import main
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model_parse import parse_model
from paraplan.planner.replay import replay
from paraplan.planner.strategy import Recompute, Schedule, Strategy

MODELS = {
    "heavy head": "gpt:layers=16,hidden=1024,heads=16,vocab=256000,seq=2048",
    "gpt 24": "gpt:layers=24,hidden=2048,heads=16,vocab=50000,seq=2048",
    "tiny vocab": "gpt:layers=16,hidden=2048,heads=16,vocab=64,seq=2048",
}


def _strategies() -> list[Strategy]:
    out = []
    for sched, v, rc, tp, zero in itertools.product(
        (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B),
        (1, 2),
        (Recompute.NONE, Recompute.FULL, Recompute.PER_LAYER),
        (1, 2),
        (1, 3),
    ):
        if (sched == Schedule.INTERLEAVED_1F1B) != (v > 1):
            continue
        out.append(
            Strategy(
                dp=4 // tp,
                tp=tp,
                pp=4,
                schedule=sched,
                virtual_stages=v,
                recompute=rc,
                zero_stage=zero,
                sequence_parallel=tp > 1,
            )
        )
    out += [Strategy(dp=16 // tp, tp=tp, pp=1, zero_stage=z) for tp in (1, 2) for z in (0, 3)]
    return out


@pytest.mark.parametrize("name", MODELS)
def test_replay_agrees_with_the_closed_form(name: str) -> None:
    profile = parse_model(MODELS[name]).to_profile(seq_len=2048)
    ev = Evaluator(profile, parse_cluster("16xh100"), TrainConfig(global_batch=64, seq_len=2048))
    for s in _strategies():
        if ev.violation(s):
            continue
        closed = ev.evaluate(s)
        r = replay(ev, s)
        assert r.peak_memory_bytes == pytest.approx(closed.memory.total_bytes, rel=1e-9)
        # Uneven stages fill and drain at their own speed (and a stage with the slowest
        # forward need not have the slowest backward): within one bubble of the closed form.
        gap = abs(r.step_time_s - closed.step_time_s)
        assert gap <= closed.time.bubble_s * (1 + 1e-9) + 1e-12, s.short()
        if s.pp == 1:
            assert r.step_time_s == pytest.approx(closed.step_time_s, rel=1e-9)
        if name == "tiny vocab" and s.tp == 1 and s.virtual_stages == 1 and s.zero_stage < 3:
            assert r.step_time_s == pytest.approx(closed.step_time_s, rel=5e-3), s.short()


@pytest.mark.parametrize(
    ("model", "cluster", "fix"),
    [
        ("gpt3-175b", "64xa100-80gb", "pp=8,tp=8"),
        ("llama3-8b", "8xh100", ""),
        ("gpt:layers=16,hidden=1024,heads=16,vocab=256000,seq=2048", "8xh100", "pp=4"),
    ],
)
def test_every_plan_records_its_replay(model: str, cluster: str, fix: str, tmp_path, capsys):
    """The plan JSON carries the replay next to the closed form, and they agree: the same
    peak memory, the step time within one pipeline bubble."""
    out = tmp_path / "plan.json"
    args = [
        "plan",
        "--model",
        model,
        "--model-source",
        "spec",
        "--cluster",
        cluster,
        "--global-batch",
        "64",
        "--seq-len",
        "2048",
        "-o",
        str(out),
    ]
    assert main(args + (["--fix", fix] if fix else [])) == 0
    capsys.readouterr()
    predicted = json.loads(out.read_text())["predicted"]
    replayed = predicted["replay"]
    assert replayed["peak_memory_bytes"] == pytest.approx(
        predicted["memory_per_gpu_bytes"], rel=1e-9
    )
    gap = abs(replayed["step_time_s"] - predicted["step_time_s"])
    assert gap <= predicted["time_breakdown"]["bubble_s"] * (1 + 1e-9) + 1e-12
    if json.loads(out.read_text())["parallelism"]["pp"] > 1:  # the plan's step is the replay's
        assert replayed["step_time_s"] == predicted["step_time_s"]


def test_a_plan_reports_its_replayed_step_with_the_saving_off_the_bubble() -> None:
    """`replayed`: a pipeline with a heavy head (uneven stages) is priced at its replay, under
    the closed form by what the slow stage's fill and drain had charged; the time breakdown
    still sums to the step (the saving comes off the bubble), throughput and MFU follow the
    step; without a pipeline nothing changes. `finalists` ranks by the replayed step."""
    from paraplan.planner.replay import finalists, replayed

    profile = parse_model(MODELS["heavy head"]).to_profile(seq_len=2048)
    ev = Evaluator(profile, parse_cluster("16xh100"), TrainConfig(global_batch=64, seq_len=2048))
    uneven = 0
    for s in _strategies():
        if ev.violation(s):
            continue
        closed = ev.evaluate(s)
        got = replayed(ev, closed)
        t, c = got.time, closed.time
        parts = (t.compute_s, t.recompute_s, t.comm_s, t.bubble_s, t.optimizer_s)
        closed_parts = (c.compute_s, c.recompute_s, c.comm_s, c.bubble_s, c.optimizer_s)
        if s.pp == 1:
            assert got == closed
            continue
        assert got.step_time_s == min(closed.step_time_s, replay(ev, s).step_time_s)
        saved = closed.step_time_s - got.step_time_s
        uneven += saved > 1e-6 * closed.step_time_s
        assert sum(parts) - sum(closed_parts) == pytest.approx(-saved, abs=1e-9)
        assert got.tokens_per_s * got.step_time_s == pytest.approx(
            closed.tokens_per_s * closed.step_time_s, rel=1e-12
        )
        assert got.mfu * got.step_time_s == pytest.approx(closed.mfu * closed.step_time_s)
    assert uneven >= 5  # the 256,000-word head's stage is slower: the fill and drain differ
    ranked = [ev.evaluate(s) for s in _strategies() if not ev.violation(s)]
    again = finalists(ev, ranked)
    assert [e.step_time_s for e in again] == sorted(replayed(ev, e).step_time_s for e in ranked)
