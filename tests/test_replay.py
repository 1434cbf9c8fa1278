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
