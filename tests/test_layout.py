"""Pipeline stages cut by cost: the split against brute force, and never slower than the even
split under the cost model (strictly faster when the head is heavy)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from paraplan.cli import main
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.layout import StageSplit, balanced_cuts, block_counts
from paraplan.planner.model_parse import parse_model
from paraplan.planner.strategy import Recompute, Schedule, Strategy


def _brute_force_bottleneck(costs: list[float], k: int) -> float:
    """Least largest-chunk cost over every split of `costs` into k non-empty chunks."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_balanced_cuts_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    k = rng.randint(1, n)
    costs = [rng.choice([1.0, 1.0, 1.0, rng.uniform(0.1, 5.0)]) for _ in range(n)]
    counts = balanced_cuts(costs, k)
    assert len(counts) == k and sum(counts) == n and min(counts) >= 1
    chunks, start = [], 0
    for c in counts:
        chunks.append(sum(costs[start : start + c]))
        start += c
    assert max(chunks) == pytest.approx(_brute_force_bottleneck(costs, k), rel=1e-8)


def test_identical_units_split_evenly() -> None:
    assert balanced_cuts([1.0] * 12, 4) == [3, 3, 3, 3]
    assert sorted(balanced_cuts([1.0] * 70, 12)) == sorted(block_counts(70, 12))


def _reference_bottleneck(units: list[float], pp: int) -> float:
    """Optimal largest stage cost by a plain O(pp * n^2) dynamic program."""
    n = len(units)
    prefix = list(itertools.accumulate(units, initial=0.0))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for j in range(k, n + 1):
            best[k][j] = min(max(best[k - 1][i], prefix[j] - prefix[i]) for i in range(k - 1, j))
    return best[pp][n]


@pytest.mark.parametrize(
    ("model", "cluster", "fix", "seq"),
    [
        ("llama3-405b", "16384xh100", "pp=16", 8192),
        ("gpt:layers=70,hidden=8192,heads=64,vocab=128256,seq=4096", "96xh100", "pp=12", 4096),
        ("gpt:layers=16,hidden=1024,heads=16,vocab=256000,seq=2048", "8xh100", "pp=4", 2048),
    ],
)
def test_plan_stages_come_from_the_partition(
    model: str, cluster: str, fix: str, seq: int, tmp_path, capsys
) -> None:
    """`paraplan plan --fix pp=...` writes stage ranges whose slowest stage (in the cost
    model's per-block seconds) is the optimum found by an independent dynamic program."""
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--model",
            model,
            "--model-source",
            "spec",
            "--cluster",
            cluster,
            "--global-batch",
            "1024",
            "--seq-len",
            str(seq),
            "--fix",
            fix,
            "-o",
            str(out),
        ]
    )
    capsys.readouterr()
    assert code == 0
    plan = json.loads(out.read_text())
    ranges = sorted(
        (c["first_layer"], c["last_layer"]) for st in plan["stages"] for c in st["chunks"]
    )
    par = plan["parallelism"]
    pp = par["pp"]
    assert len(ranges) == pp * par["virtual_stages"]
    profile = parse_model(model).to_profile(seq_len=seq)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(profile.layers) - 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
    ev = Evaluator(profile, parse_cluster(cluster), TrainConfig(global_batch=1024, seq_len=seq))
    sm = ev.stage_model
    policy = Recompute(plan["recompute_policy"])
    layout = sm.layout(pp, par["virtual_stages"], policy, par["tp"], par["sequence_parallel"])
    units = sm.unit_costs_s(layout)  # per block, embedding in the first, head in the last
    counts = [b - a + 1 for a, b in ranges]
    counts[0] -= 1  # the embedding
    counts[-1] -= 1  # the head
    costs, start = [], 0
    for c in counts:
        costs.append(sum(units[start : start + c]))
        start += c
    assert max(costs) == pytest.approx(_reference_bottleneck(units, len(counts)), rel=1e-9)


def _strategies(pp: int) -> list[Strategy]:
    out = []
    for sched, v, rc, mbs, tp in itertools.product(
        (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED_1F1B),
        (1, 2),
        (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL, Recompute.PER_LAYER),
        (1, 2),
        (1, 2),
    ):
        if (sched == Schedule.INTERLEAVED_1F1B) != (v > 1):
            continue
        out.append(
            Strategy(
                dp=2 // tp,
                tp=tp,
                pp=pp,
                schedule=sched,
                virtual_stages=v,
                recompute=rc,
                micro_batch_size=mbs,
                zero_stage=1,
                sequence_parallel=tp > 1,
            )
        )
    return out


@pytest.mark.parametrize(
    ("model", "heavy_head"),
    [
        ("gpt:layers=16,hidden=1024,heads=16,vocab=256000,seq=2048", True),
        ("gpt:layers=14,hidden=2048,heads=16,vocab=50000,seq=2048", False),
        ("gpt:layers=30,hidden=1024,heads=16,vocab=32000,seq=2048", False),
    ],
)
def test_balanced_split_never_slower_than_even(model: str, heavy_head: bool) -> None:
    """Each pinned strategy, priced with the cost-balanced split and with the even split."""
    profile = parse_model(model).to_profile(seq_len=2048)
    cluster = parse_cluster("8xh100")
    train = TrainConfig(global_batch=32, seq_len=2048)
    balanced = Evaluator(profile, cluster, train)
    even = Evaluator(profile, cluster, train, StageSplit.EVEN)
    faster = 0
    for s in _strategies(4):
        if balanced.violation(s):
            continue
        b, e = balanced.evaluate(s).step_time_s, even.evaluate(s).step_time_s
        assert b <= e * (1 + 1e-9), s.short()
        faster += b < e * (1 - 1e-3)
    if heavy_head:
        assert faster > 0
