"""The structural rules: each can fire, pins and strategies are judged by the same list, and a
pin is rejected only when no strategy with it can satisfy the rule (fast, CPU only). Also the
integer helper the search enumerates with."""

from __future__ import annotations

import itertools
import random
import re
import time
from dataclasses import fields, replace

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.rules import RULES, ProblemShape, Rule, Violation, violation
from paraplan.planner.intmath import divisors, prime_factors
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.strategy import MeshAxis, Schedule, Strategy

# A MoE model (8 experts, GQA with 4 KV heads) on 16 GPUs: every rule has a way to break.
SHAPE = ProblemShape(
    heads=8,
    kv_heads=4,
    ffn=96,
    experts=8,
    is_moe=True,
    num_blocks=16,
    num_gpus=16,
    seq_len=100,
    global_batch=32,
)
DENSE = replace(SHAPE, experts=0, is_moe=False)

# One strategy per rule, breaking that rule (and, being checked in order, no earlier one).
BREAKS: dict[Rule, tuple[ProblemShape, Strategy]] = {
    Rule.WORLD_SIZE: (SHAPE, Strategy(dp=4, tp=2, pp=1)),
    Rule.TP_DIVIDES_MODEL: (SHAPE, Strategy(dp=1, tp=16, pp=1)),
    Rule.TP_FITS_KV_HEADS: (replace(SHAPE, kv_heads=3), Strategy(dp=8, tp=2, pp=1)),
    Rule.SP_NEEDS_TP: (SHAPE, Strategy(dp=16, tp=1, pp=1, sequence_parallel=True)),
    Rule.CP_SPLITS_SEQUENCE: (SHAPE, Strategy(dp=4, tp=1, pp=1, cp=4)),  # 100 % 8
    Rule.EP_NEEDS_MOE: (DENSE, Strategy(dp=16, tp=1, pp=1, ep=2)),
    Rule.EP_DIVIDES: (SHAPE, Strategy(dp=4, tp=4, pp=1, ep=8)),
    Rule.EXPERT_TP: (SHAPE, Strategy(dp=4, tp=4, pp=1, ep=4, expert_tp=1)),  # no SP
    Rule.ZERO_STAGE: (SHAPE, Strategy(dp=16, tp=1, pp=1, zero_stage=4)),
    Rule.HSDP_SHARDS_DP: (SHAPE, Strategy(dp=16, tp=1, pp=1, zero_stage=2, dp_shard=8)),
    Rule.OFFLOAD_NEEDS_ZERO: (SHAPE, Strategy(dp=16, tp=1, pp=1, offload_optimizer=True)),
    Rule.BATCH_DIVIDES: (SHAPE, Strategy(dp=16, tp=1, pp=1, micro_batch_size=3)),
    Rule.SCHEDULE_MATCHES_PP: (SHAPE, Strategy(dp=8, tp=1, pp=2)),
    Rule.VIRTUAL_STAGES_MATCH_SCHEDULE: (
        SHAPE,
        Strategy(dp=8, tp=1, pp=2, schedule=Schedule.ONE_F_ONE_B, virtual_stages=2),
    ),
    Rule.STAGES_WITHIN_BLOCKS: (
        SHAPE,
        Strategy(dp=2, tp=1, pp=8, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=4),
    ),
    Rule.INTERLEAVED_MICROBATCHES: (
        SHAPE,
        Strategy(
            dp=2,
            tp=1,
            pp=8,
            schedule=Schedule.INTERLEAVED_1F1B,
            virtual_stages=2,
            micro_batch_size=4,
        ),  # 32 / (2*4) = 4 micro-batches, not a multiple of 8
    ),
    Rule.MESH_ORDER: (
        SHAPE,
        Strategy(dp=16, tp=1, pp=1, mesh_order=(MeshAxis.DP, MeshAxis.DP, MeshAxis.CP)),
    ),
}


def test_every_rule_has_a_check():
    assert [rule for rule, _ in RULES] == list(Rule)
    for rule in Rule:  # the pins a refusal names (`Search` reads them)
        assert rule.fields and set(rule.fields) <= {f.name for f in fields(Pins)} | {"mesh_order"}


@pytest.mark.parametrize("rule", list(Rule), ids=[r.value for r in Rule])
def test_every_rule_can_fire(rule):
    shape, s = BREAKS[rule]
    broken = violation(shape, s)
    assert isinstance(broken, Violation)
    assert broken.rule is rule
    assert broken.message and str(broken) == broken.message


def test_valid_strategies_break_nothing():
    for s in (
        Strategy(dp=16, tp=1, pp=1),
        Strategy(
            dp=4, tp=4, pp=1, ep=4, sequence_parallel=True, zero_stage=3, offload_optimizer=True
        ),
        # ep=8 > dp=4: valid only with the experts folded over TP (ep / tp = 2 divides dp)
        Strategy(dp=4, tp=4, pp=1, ep=8, expert_tp=1, sequence_parallel=True),
        Strategy(dp=2, tp=2, pp=2, cp=2, micro_batch_size=2, schedule=Schedule.ONE_F_ONE_B),
        Strategy(dp=2, tp=1, pp=8, schedule=Schedule.GPIPE, micro_batch_size=2),
        Strategy(dp=4, tp=2, pp=2, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=3),
    ):
        assert violation(SHAPE, s) is None, s


def test_messages_name_the_values():
    assert "dp*tp*pp*cp = 4*2*1*1 = 8" in violation(*BREAKS[Rule.WORLD_SIZE]).message
    assert "tp=16" in violation(*BREAKS[Rule.TP_DIVIDES_MODEL]).message
    assert "kv_heads=3" in violation(*BREAKS[Rule.TP_FITS_KV_HEADS]).message
    assert "global batch of 32" in violation(*BREAKS[Rule.BATCH_DIVIDES]).message
    assert "4 micro-batches" in violation(*BREAKS[Rule.INTERLEAVED_MICROBATCHES]).message


# --- pins: the same rules on partial assignments ---------------------------------------------

# A pin breaking each rule (mesh order cannot be pinned; Pins itself refuses zero_stage=7).
PIN_BREAKS: dict[Rule, tuple[ProblemShape, Pins]] = {
    Rule.WORLD_SIZE: (SHAPE, Pins(tp=3)),
    Rule.TP_DIVIDES_MODEL: (SHAPE, Pins(tp=16)),
    Rule.TP_FITS_KV_HEADS: (replace(SHAPE, kv_heads=3), Pins(tp=2)),
    Rule.SP_NEEDS_TP: (SHAPE, Pins(sequence_parallel=True, tp=1)),
    Rule.CP_SPLITS_SEQUENCE: (SHAPE, Pins(cp=16)),
    Rule.EP_NEEDS_MOE: (DENSE, Pins(ep=2)),
    Rule.EP_DIVIDES: (SHAPE, Pins(ep=16)),
    Rule.EXPERT_TP: (SHAPE, Pins(tp=4, expert_tp=2)),
    Rule.HSDP_SHARDS_DP: (SHAPE, Pins(dp=16, dp_shard=3)),
    Rule.OFFLOAD_NEEDS_ZERO: (SHAPE, Pins(offload_optimizer=True, zero_stage=0)),
    Rule.BATCH_DIVIDES: (SHAPE, Pins(micro_batch_size=3)),
    Rule.SCHEDULE_MATCHES_PP: (SHAPE, Pins(pp=1, schedule=Schedule.GPIPE)),
    Rule.VIRTUAL_STAGES_MATCH_SCHEDULE: (SHAPE, Pins(virtual_stages=2, schedule=Schedule.GPIPE)),
    Rule.STAGES_WITHIN_BLOCKS: (SHAPE, Pins(pp=8, virtual_stages=4)),
    Rule.INTERLEAVED_MICROBATCHES: (
        SHAPE,
        Pins(dp=2, pp=8, micro_batch_size=4, schedule=Schedule.INTERLEAVED_1F1B),
    ),
}


@pytest.mark.parametrize("rule", list(PIN_BREAKS), ids=[r.value for r in PIN_BREAKS])
def test_a_pin_breaking_a_rule_is_named_by_that_rule(rule):
    shape, pins = PIN_BREAKS[rule]
    broken = violation(shape, pins)
    assert broken is not None and broken.rule is rule


def test_pins_that_a_completion_can_satisfy_pass():
    for pins in (
        Pins(),
        Pins(sequence_parallel=True),  # tp > 1 can still be chosen
        Pins(tp=2, pp=2),  # dp*cp = 4 remains
        Pins(schedule=Schedule.INTERLEAVED_1F1B),
        Pins(ep=4),  # dp can be a multiple of 4
        Pins(dp=2, ep=8),  # ep / tp can divide dp, the experts folded over tp = 4 or 8
        Pins(expert_tp=1),  # tp = 1, or folded experts
        Pins(offload_optimizer=True),
        Pins(dp=4, micro_batch_size=8),
    ):
        assert violation(SHAPE, pins) is None, pins


def test_a_complete_pin_is_judged_as_its_strategy():
    for rule, (shape, s) in BREAKS.items():
        if rule in (Rule.MESH_ORDER, Rule.ZERO_STAGE):
            continue  # not pinnable / refused by Pins itself
        broken = violation(shape, Pins.of(s))
        assert broken is not None and broken.rule is rule


def _grid() -> list[Strategy]:
    out = []
    for dp, tp, pp, cp in itertools.product((1, 2, 3, 4, 8), repeat=4):
        for ep, etp, zero, sp, off, mbs, (sched, v) in itertools.product(
            (1, 2, 16),
            (None, 1),
            (0, 1),
            (False, True),
            (False, True),
            (1, 2, 3),
            (
                (Schedule.NONE, 1),
                (Schedule.GPIPE, 1),
                (Schedule.INTERLEAVED_1F1B, 2),
                (Schedule.INTERLEAVED_1F1B, 1),
            ),
        ):
            out.append(
                Strategy(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=ep,
                    expert_tp=etp,
                    zero_stage=zero,
                    sequence_parallel=sp,
                    offload_optimizer=off,
                    micro_batch_size=mbs,
                    schedule=sched,
                    virtual_stages=v,
                )
            )
    return out


def test_a_rule_fires_on_a_pin_only_if_it_fires_on_every_completion():
    """Soundness of the partial checks: a strategy agreeing with the pins is a completion of
    them, so a rule rejecting the pins must reject it too (sampled)."""
    rng = random.Random(7)
    grid = _grid()
    names = [f.name for f in fields(Pins)]
    checks = dict(RULES)
    fired = 0
    for _ in range(6000):
        s = rng.choice(grid)
        keep = [k for k in names if rng.random() < 0.4]
        pins = Pins(**{k: getattr(s, k) for k in keep})
        for shape in (SHAPE, DENSE):
            broken = violation(shape, pins)
            if broken is not None:
                fired += 1
                assert checks[broken.rule](shape, s) is not None, (pins, s)
    assert fired > 500  # the sample exercises the rules


# --- the search rejects pins with the same rules -----------------------------------------------


@pytest.fixture(scope="module")
def gpt2_ev() -> Evaluator:
    spec = parse_model("gpt2")
    return Evaluator(
        spec.to_profile(seq_len=1024),
        parse_cluster("8xh100"),
        TrainConfig(global_batch=16, seq_len=1024),
    )


@pytest.mark.parametrize(
    ("fix", "rule"),
    [
        ("tp=3", Rule.WORLD_SIZE),
        ("tp=8", Rule.TP_DIVIDES_MODEL),
        ("sp=true,tp=1", Rule.SP_NEEDS_TP),
        ("ep=2", Rule.EP_NEEDS_MOE),
        ("etp=3,tp=2", Rule.EXPERT_TP),
        ("offload=true,zero=0", Rule.OFFLOAD_NEEDS_ZERO),
        ("mbs=3", Rule.BATCH_DIVIDES),
        ("pp=1,schedule=gpipe", Rule.SCHEDULE_MATCHES_PP),
        ("schedule=1f1b,vpp=2", Rule.VIRTUAL_STAGES_MATCH_SCHEDULE),
        ("pp=8,vpp=2", Rule.STAGES_WITHIN_BLOCKS),
        ("dp=2,pp=4,mbs=4,schedule=interleaved_1f1b", Rule.INTERLEAVED_MICROBATCHES),
    ],
)
def test_search_rejects_a_pin_naming_its_rule(gpt2_ev, fix, rule):
    pins = Pins.parse(fix)
    shape = gpt2_ev.shape
    assert violation(shape, pins).rule is rule  # what the rule list says of the pins...
    with pytest.raises(ValueError) as err:
        Search(gpt2_ev, pins)
    message = str(err.value)
    assert message.startswith("--fix ")  # ... is what the search says, naming the pinned values
    named = message.removeprefix("--fix ").split(":")[0]
    assert named and set(named.split(",")) <= set(pins.describe().split(","))
    assert f"(rule {rule})" in message


def test_cp_rule_reads_the_sequence_length():
    # cp=8 splits a sequence into 16 chunks (causal load balancing): 1024 tokens do, 100 not.
    assert violation(replace(SHAPE, seq_len=1024), Pins(cp=8)) is None
    assert re.search(r"cp=8 needs seq_len=100", violation(SHAPE, Pins(cp=8)).message)


# --- integer helper -----------------------------------------------------------------------------


def test_divisors_match_the_definition():
    for n in range(1, 2001):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n


def test_divisors_of_large_numbers_are_fast():
    start = time.perf_counter()
    got = divisors(10**12)
    assert len(got) == 13 * 13  # 2^12 * 5^12
    assert got[:6] == [1, 2, 4, 5, 8, 10] and got[-1] == 10**12
    assert all(10**12 % d == 0 for d in got)
    assert divisors(999_999_999_989) == [1, 999_999_999_989]  # the largest prime below 1e12
    assert prime_factors(2**40 * 3) == {2: 40, 3: 1}
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("n", [0, -4, 2.0, True])
def test_divisors_reject_non_positive_integers(n):
    with pytest.raises(ValueError, match="positive integer"):
        divisors(n)
