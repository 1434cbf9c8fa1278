"""The cost model against the papers it cites, and properties of the evaluator (fast, CPU only).

Expected values are written out from the papers' formulas or the datasheets, never taken from
the code under test.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.memory import (
    in_flight_microbatches,
    layer_act_bytes,
)
from paraplan.planner.cost.memory_totals import memory_totals
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.model_spec import PRESETS, Attention, Norm, TransformerSpec
from paraplan.planner.strategy import Recompute, Schedule, Strategy

# --- activations per layer (Korthikanti et al. 2022, Table 2) -------------------------------


def _gpt_block_spec(*, hidden: int, heads: int, seq: int = 2048) -> TransformerSpec:
    """A GPT block as the paper models it: learned positions, biases, LayerNorm, dropout,
    unfused attention and a 4h GELU MLP."""
    return TransformerSpec(
        name=f"gpt-h{hidden}-a{heads}",
        layers=2,
        hidden=hidden,
        heads=heads,
        vocab=51200,
        seq=seq,
        learned_pos=True,
        bias=True,
        norm=Norm.LAYERNORM,
        dropout=True,
        attention=Attention.MATH,
    )


# (a, h, s) of the models in Korthikanti et al. 2022, Table 3 (22B, 175B, 530B, 1T).
KORTHIKANTI_CONFIGS = [(64, 6144, 2048), (96, 12288, 2048), (128, 20480, 2048), (160, 25600, 2048)]


def _korthikanti_block(a: int, h: int, s: int):
    return _gpt_block_spec(hidden=h, heads=a, seq=s).to_profile(seq_len=s, act_bytes=2).layers[1]


@pytest.mark.parametrize(("a", "h", "s"), KORTHIKANTI_CONFIGS)
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_table_2(a, h, s, t):
    block = _korthikanti_block(a, h, s)
    b = 1  # the profile's figures are per sequence
    sbh = s * b * h

    def act(*, tp: int, sp: bool, recompute: Recompute) -> float:
        return layer_act_bytes(block, tp=tp, sp=sp, cp=1, recompute=recompute)

    none, selective, full = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL
    # No parallelism: sbh(34 + 5as/h).
    assert act(tp=1, sp=False, recompute=none) == pytest.approx(sbh * (34 + 5 * a * s / h))
    # Tensor parallel: sbh(10 + 24/t + 5as/(ht)).
    assert act(tp=t, sp=False, recompute=none) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t))
    )
    # Tensor + sequence parallel: (sbh/t)(34 + 5as/h).
    assert act(tp=t, sp=True, recompute=none) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    # Tensor parallel + selective recompute: sbh(10 + 24/t).
    assert act(tp=t, sp=False, recompute=selective) == pytest.approx(sbh * (10 + 24 / t))
    # Tensor + sequence parallel + selective recompute: sbh(34/t).
    assert act(tp=t, sp=True, recompute=selective) == pytest.approx(sbh * 34 / t)
    # Full recompute keeps only the block's input: 2sbh.
    assert act(tp=t, sp=False, recompute=full) == pytest.approx(2 * sbh)


def test_korthikanti_table_2_for_the_gpt3_preset():
    spec = PRESETS["gpt3-175b"]
    a, h, s = spec.heads, spec.hidden, spec.seq
    block = spec.to_profile(seq_len=s, act_bytes=2).layers[1]
    assert layer_act_bytes(block, tp=1, sp=False, cp=1, recompute=Recompute.NONE) == pytest.approx(
        s * h * (34 + 5 * a * s / h)
    )
    t = 8
    assert layer_act_bytes(block, tp=t, sp=True, cp=1, recompute=Recompute.NONE) == pytest.approx(
        s * h / t * (34 + 5 * a * s / h)
    )


def test_context_parallel_splits_the_sequence():
    a, h, s = 96, 12288, 2048
    block = _korthikanti_block(a, h, s)
    whole = layer_act_bytes(block, tp=8, sp=True, cp=1, recompute=Recompute.SELECTIVE)
    halves = layer_act_bytes(block, tp=8, sp=True, cp=2, recompute=Recompute.SELECTIVE)
    assert halves == pytest.approx(whole / 2)


# --- FLOPs (Narayanan et al. 2021, Eq. 3) -----------------------------------------------------

# (l, h, a, V, s): GPT-3 175B-like (Table 1 of Narayanan et al.) and the 530B and 1T rows.
NARAYANAN_CONFIGS = [
    (96, 12288, 96, 51200, 2048),
    (105, 20480, 128, 51200, 2048),
    (128, 25600, 160, 51200, 2048),
]


@pytest.mark.parametrize(("layers", "h", "a", "vocab", "s"), NARAYANAN_CONFIGS)
def test_narayanan_eq3_flops_with_full_recompute(layers, h, a, vocab, s):
    spec = parse_model(f"gpt:layers={layers},hidden={h},heads={a},vocab={vocab},seq={s}")
    profile = spec.to_profile(seq_len=s)
    batch = 1536
    train_flops = batch * sum(x.fwd_flops + x.bwd_flops for x in profile.layers)
    recompute_flops = batch * sum(x.fwd_flops for x in profile.layers if x.kind == LayerKind.BLOCK)
    eq3 = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))
    assert train_flops + recompute_flops == pytest.approx(eq3, rel=0.01)


@pytest.mark.parametrize(("layers", "h", "a", "vocab", "s"), NARAYANAN_CONFIGS[:1])
def test_model_flops_without_recompute(layers, h, a, vocab, s):
    # Eq. 3 without the recompute forward: 3 passes of 24sh^2 + 4s^2h per layer, and the
    # logit layer's 6shV: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    spec = parse_model(f"gpt:layers={layers},hidden={h},heads={a},vocab={vocab},seq={s}")
    ev = Evaluator(
        spec.to_profile(seq_len=s),
        parse_cluster("8xh100"),
        TrainConfig(global_batch=8, seq_len=s),
    )
    expected = 72 * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * layers * h))
    assert ev.model_flops_per_seq == pytest.approx(expected, rel=0.01)


# --- in-flight micro-batches per schedule -----------------------------------------------------


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 2), (8, 64)])
def test_gpipe_holds_every_micro_batch(pp, m):
    # Huang et al. 2019: all m forwards run before any backward.
    for stage in range(pp):
        got = in_flight_microbatches(
            Schedule.GPIPE, pp=pp, stage=stage, num_microbatches=m, virtual_stages=1
        )
        assert got == m


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 2), (8, 64), (8, 3)])
def test_1f1b_holds_pp_minus_stage(pp, m):
    # Narayanan et al. 2021 §2.2.1: stage i warms up with pp - i forwards at most.
    for stage in range(pp):
        got = in_flight_microbatches(
            Schedule.ONE_F_ONE_B, pp=pp, stage=stage, num_microbatches=m, virtual_stages=1
        )
        assert got == min(pp - stage, m)


@pytest.mark.parametrize(("pp", "v"), [(2, 2), (4, 2), (4, 3), (8, 4), (16, 8)])
def test_interleaved_first_stage_holds_extra_chunks(pp, v):
    # Korthikanti et al. 2022 §4.2.3: the first stage of the interleaved schedule keeps
    # L(1 + (p-1)/(pv)) layers' activations, i.e. p(1 + (p-1)/(pv)) stages' worth.
    m = 64 * pp
    got = in_flight_microbatches(
        Schedule.INTERLEAVED_1F1B, pp=pp, stage=0, num_microbatches=m, virtual_stages=v
    )
    assert got == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_no_pipeline_holds_one_micro_batch():
    assert (
        in_flight_microbatches(Schedule.NONE, pp=1, stage=0, num_microbatches=16, virtual_stages=1)
        == 1
    )


# --- the evaluator --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_ev() -> Evaluator:
    profile = PRESETS["gpt2"].to_profile(seq_len=1024)
    return Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=16, seq_len=1024))


@pytest.fixture(scope="module")
def llama_ev() -> Evaluator:
    spec = parse_model(
        "llama:layers=8,hidden=4096,heads=32,kv_heads=8,ffn=11008,vocab=32000,seq=4096"
    )
    cluster = parse_cluster("16xa100-80gb")  # two nodes of 8
    return Evaluator(spec.to_profile(), cluster, TrainConfig(global_batch=32, seq_len=4096))


@pytest.fixture(scope="module")
def moe_ev() -> Evaluator:
    spec = parse_model(
        "moe:layers=4,hidden=1024,heads=8,kv_heads=2,vocab=32000,seq=2048,experts=8,top_k=2"
    )
    return Evaluator(
        spec.to_profile(), parse_cluster("8xh100"), TrainConfig(global_batch=16, seq_len=2048)
    )


def test_profile_and_training_sequence_must_agree():
    profile = PRESETS["gpt2"].to_profile(seq_len=512)
    with pytest.raises(ValueError, match="seq_len=512"):
        Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=8, seq_len=1024))


def test_memory_falls_with_each_zero_stage(gpt2_ev, llama_ev):
    for ev, base in (
        (gpt2_ev, Strategy(dp=8, tp=1, pp=1)),
        (llama_ev, Strategy(dp=4, tp=4, pp=1)),
    ):
        totals = [ev.memory(replace(base, zero_stage=z))[0] for z in (0, 1, 2)]
        assert totals[0].optimizer_bytes > totals[1].optimizer_bytes
        assert totals[1].grads_bytes > totals[2].grads_bytes
        assert totals[0].total_bytes > totals[1].total_bytes > totals[2].total_bytes
        z3 = ev.memory(replace(base, zero_stage=3))[0]
        assert z3.params_bytes < totals[2].params_bytes
    # beside a pipeline ZeRO-2/3 hold ZeRO-1's parameters and gradients (held_zero_stage;
    # tests/test_pipeline_zero.py): only the optimizer states shard
    base = Strategy(dp=2, tp=4, pp=2, schedule=Schedule.ONE_F_ONE_B)
    totals = [llama_ev.memory(replace(base, zero_stage=z))[0] for z in (0, 1, 2, 3)]
    assert totals[0].optimizer_bytes > totals[1].optimizer_bytes
    assert totals[0].total_bytes > totals[1].total_bytes == totals[2].total_bytes
    assert totals[2].total_bytes == totals[3].total_bytes


def test_sequence_parallel_shrinks_activations(llama_ev):
    s = Strategy(dp=4, tp=4, pp=1)
    tp_only = llama_ev.memory(s)[0].activations_bytes
    with_sp = llama_ev.memory(replace(s, sequence_parallel=True))[0].activations_bytes
    assert with_sp < tp_only


def test_full_recompute_trades_time_for_memory(gpt2_ev, llama_ev):
    for ev, s in ((gpt2_ev, Strategy(dp=8, tp=1, pp=1)), (llama_ev, Strategy(dp=4, tp=4, pp=1))):
        plain, full = ev.evaluate(s), ev.evaluate(replace(s, recompute=Recompute.FULL))
        selective = ev.evaluate(replace(s, recompute=Recompute.SELECTIVE))
        assert full.memory.activations_bytes < plain.memory.activations_bytes
        assert selective.memory.activations_bytes < plain.memory.activations_bytes
        assert full.step_time_s > plain.step_time_s
        assert full.time.recompute_s > selective.time.recompute_s > 0.0
        assert plain.time.recompute_s == 0.0


def test_1f1b_needs_no_more_memory_than_gpipe(gpt2_ev, llama_ev):
    for ev, s in (
        (gpt2_ev, Strategy(dp=2, tp=1, pp=4)),
        (llama_ev, Strategy(dp=2, tp=2, pp=4)),
    ):
        gpipe = ev.memory(replace(s, schedule=Schedule.GPIPE))[0].total_bytes
        one_f_one_b = ev.memory(replace(s, schedule=Schedule.ONE_F_ONE_B))[0].total_bytes
        # m = 8 micro-batches > pp = 4 stages: GPipe holds strictly more.
        assert one_f_one_b < gpipe


def test_bubble_fractions(gpt2_ev):
    # Narayanan et al. 2021 §2.2: the bubble is (p-1) micro-batch slots, (p-1)/v interleaved,
    # out of m + bubble slots in all.
    pp, m = 4, 8
    base = Strategy(dp=2, tp=1, pp=pp)
    one_f_one_b = gpt2_ev.evaluate(replace(base, schedule=Schedule.ONE_F_ONE_B))
    assert one_f_one_b.num_microbatches == m
    assert one_f_one_b.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    for v in (2, 3):
        inter = gpt2_ev.evaluate(
            replace(base, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=v)
        )
        assert inter.bubble_fraction == pytest.approx((pp - 1) / v / (m + (pp - 1) / v))
        assert inter.bubble_fraction < one_f_one_b.bubble_fraction
    no_pipeline = gpt2_ev.evaluate(Strategy(dp=8, tp=1, pp=1))
    assert no_pipeline.bubble_fraction == 0.0
    assert no_pipeline.time.bubble_s == 0.0


def test_throughput_is_tokens_over_step_time(gpt2_ev, llama_ev):
    for ev, s in (
        (gpt2_ev, Strategy(dp=8, tp=1, pp=1)),
        (gpt2_ev, Strategy(dp=2, tp=2, pp=2, schedule=Schedule.ONE_F_ONE_B)),
        (llama_ev, Strategy(dp=2, tp=8, pp=1, sequence_parallel=True, zero_stage=1)),
    ):
        est = ev.evaluate(s)
        t = ev.train
        assert est.tokens_per_s == pytest.approx(t.global_batch * t.seq_len / est.step_time_s)
        parts = est.time
        assert est.step_time_s == pytest.approx(
            parts.compute_s + parts.recompute_s + parts.comm_s + parts.bubble_s + parts.optimizer_s
        )


def test_mfu_is_positive_and_below_the_matmul_efficiency(gpt2_ev, llama_ev):
    for ev, s in (
        (gpt2_ev, Strategy(dp=8, tp=1, pp=1)),
        (gpt2_ev, Strategy(dp=1, tp=4, pp=2, schedule=Schedule.GPIPE)),
        (llama_ev, Strategy(dp=4, tp=4, pp=1, recompute=Recompute.FULL)),
        (
            llama_ev,
            Strategy(dp=1, tp=8, pp=2, sequence_parallel=True, schedule=Schedule.ONE_F_ONE_B),
        ),
    ):
        est = ev.evaluate(s)
        assert 0.0 < est.mfu < ev.acc.matmul_efficiency


def test_mfu_is_model_flops_over_time_and_peak(gpt2_ev):
    # PaLM Appendix B: model FLOPs (no recompute) / (step time * GPUs * peak). gpt2's FLOPs
    # per sequence written out (Narayanan Eq. 3 without recompute): 72 s l h^2 (1 + s/(6h)
    # + V/(12 l h)); H100 SXM bf16 dense peak 989.4 TFLOP/s (datasheet, sparsity halved).
    layers, h, vocab, s = 12, 768, 50257, 1024
    flops_per_seq = 72 * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * layers * h))
    est = gpt2_ev.evaluate(Strategy(dp=8, tp=1, pp=1, recompute=Recompute.FULL))
    expected = 16 * flops_per_seq / (est.step_time_s * 8 * 989.4e12)
    assert est.mfu == pytest.approx(expected, rel=1e-9)


def test_fsdp_buffer_holds_only_the_local_experts(moe_ev):
    # ZeRO-3/FSDP keeps two blocks' parameters and one block's gradients unsharded (Zhao et
    # al. 2023 §3.2); with expert parallelism a rank gathers only its experts/ep experts.
    # The tiny MoE block, written out: QKV (h x (h + 2*kv_dim)) + proj (h x h) + two RMSNorms
    # + router (h x E) dense; E SwiGLU experts of 3 * h * f.
    h, kv_dim, experts, f = 1024, 2 * 128, 8, 4 * 1024
    dense = h * (h + 2 * kv_dim) + h * h + 2 * h + h * experts
    expert = experts * 3 * h * f
    overhead = moe_ev.acc.runtime_overhead_bytes
    for ep in (1, 2, 4, 8):
        s = Strategy(dp=8, tp=1, pp=1, ep=ep, zero_stage=3)
        other = moe_ev.memory(s)[0].other_bytes
        # bf16 params x 2 + the fp32 reduce-scatter input of the gradients (reduce_dtype)
        unsharded = (dense + expert / ep) * (2 * 2 + 4)
        assert other == pytest.approx(overhead + unsharded, rel=1e-12), ep


def test_full_recompute_never_raises_peak_memory(gpt2_ev):
    # Physically, full recompute holds at every instant a subset of what no recompute holds:
    # block inputs instead of all block activations, and one block re-materialized at a time
    # whose activations no recompute also holds at that point of the backward pass.
    # gpt2 with pp=8: the last stage runs 1 block + the head with 1 micro-batch in flight.
    s = Strategy(dp=1, tp=1, pp=8, schedule=Schedule.ONE_F_ONE_B, micro_batch_size=8)
    plain = gpt2_ev.memory(s)[0].total_bytes
    full = gpt2_ev.memory(replace(s, recompute=Recompute.FULL))[0].total_bytes
    assert full <= plain


def _choices(s: Strategy):
    sps = (False, True) if s.tp > 1 else (False,)
    return tuple(
        (sp, zero, off, rc)
        for sp, zero, off, rc in itertools.product(sps, range(4), (False, True), Recompute)
        if not (off and zero == 0)
    )


@pytest.mark.parametrize(
    ("which", "strategy"),
    [
        ("gpt2", Strategy(dp=8, tp=1, pp=1, micro_batch_size=2)),
        ("gpt2", Strategy(dp=4, tp=2, pp=1, micro_batch_size=1)),  # 4 micro-batches, no PP
        ("llama", Strategy(dp=4, tp=4, pp=1, micro_batch_size=2)),
        ("gpt2", Strategy(dp=2, tp=2, pp=2, schedule=Schedule.ONE_F_ONE_B)),
        ("gpt2", Strategy(dp=2, tp=1, pp=4, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=3)),
        ("llama", Strategy(dp=2, tp=4, pp=2, schedule=Schedule.GPIPE, micro_batch_size=2)),
        ("llama", Strategy(dp=2, tp=2, pp=2, cp=2, schedule=Schedule.ONE_F_ONE_B)),
        ("moe", Strategy(dp=4, tp=2, pp=1, ep=4)),
        ("moe", Strategy(dp=2, tp=2, pp=2, ep=2, schedule=Schedule.ONE_F_ONE_B)),
    ],
)
def test_memory_totals_matches_memory(which, strategy, gpt2_ev, llama_ev, moe_ev):
    ev = {"gpt2": gpt2_ev, "llama": llama_ev, "moe": moe_ev}[which]
    choices = _choices(strategy)
    totals = memory_totals(ev, strategy, choices)
    assert len(totals) == len(choices)
    for (sp, zero, off, rc), total in zip(choices, totals, strict=True):
        s = replace(
            strategy, sequence_parallel=sp, zero_stage=zero, offload_optimizer=off, recompute=rc
        )
        assert not ev.violation(s), s
        assert total == pytest.approx(ev.memory(s)[0].total_bytes, rel=1e-12), s
    # ZeRO-3's optimizer offload taking its parameters with it (the runnable search's)
    followed = memory_totals(ev, strategy, choices, params_follow=True)
    for (sp, zero, off, rc), total in zip(choices, followed, strict=True):
        s = replace(
            strategy,
            sequence_parallel=sp,
            zero_stage=zero,
            offload_optimizer=off,
            recompute=rc,
            offload_params=off and zero == 3,
        )
        assert total == pytest.approx(ev.memory(s)[0].total_bytes, rel=1e-12), s


VIOLATIONS = [
    ("world size", Strategy(dp=4, tp=1, pp=1), "8"),
    ("tp divides heads", Strategy(dp=1, tp=8, pp=1), "tp=8"),
    ("sp needs tp", Strategy(dp=8, tp=1, pp=1, sequence_parallel=True), "sequence_parallel"),
    (
        "interleaved needs v > 1",
        Strategy(dp=4, tp=1, pp=2, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=1),
        "virtual_stages=1",
    ),
    ("offload needs zero", Strategy(dp=8, tp=1, pp=1, offload_optimizer=True), "offload"),
    ("batch divisible", Strategy(dp=8, tp=1, pp=1, micro_batch_size=3), "global_batch=16"),
    ("schedule without pp", Strategy(dp=8, tp=1, pp=1, schedule=Schedule.GPIPE), "pp=1"),
    ("pp without schedule", Strategy(dp=4, tp=1, pp=2), "pp=2"),
    ("ep needs moe", Strategy(dp=8, tp=1, pp=1, ep=2), "ep=2"),
]


@pytest.mark.parametrize(("rule", "strategy", "named"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_violation_names_the_broken_rule(gpt2_ev, rule, strategy, named):
    broken = gpt2_ev.violation(strategy)
    assert broken is not None, rule
    assert named in broken.message
    with pytest.raises(ValueError, match="not valid"):
        gpt2_ev.evaluate(strategy)


def test_cp_must_split_the_sequence_evenly():
    spec = parse_model("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=1000")
    ev = Evaluator(
        spec.to_profile(), parse_cluster("8xh100"), TrainConfig(global_batch=8, seq_len=1000)
    )
    # 1000 is not divisible by 2 * 8 (causal load balancing splits it in 2*cp chunks).
    assert "cp=8" in str(ev.violation(Strategy(dp=1, tp=1, pp=1, cp=8, micro_batch_size=8)))
    assert ev.violation(Strategy(dp=2, tp=1, pp=1, cp=4, micro_batch_size=4)) is None


def test_valid_strategies_have_no_violation(gpt2_ev):
    for s in (
        Strategy(dp=8, tp=1, pp=1),
        Strategy(dp=2, tp=4, pp=1, sequence_parallel=True, zero_stage=3, offload_optimizer=True),
        Strategy(dp=2, tp=1, pp=4, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=3),
    ):
        assert gpt2_ev.violation(s) is None


def test_torch_sequence_parallelism_keeps_the_gathered_inputs_whole():
    """Korthikanti et al. 2022 §4.2.2: with SP a block keeps 1/t of its replicated bytes (the
    shards, gathered again in backward: Megatron-LM). torch's SequenceParallel (the executor,
    torchtitan) keeps the attention's and the MLP's all-gathered inputs whole instead: two
    block inputs, less the shares Megatron already counts. Full recompute keeps only the
    (sharded) block input either way; without SP nothing changes."""
    block = next(
        x for x in PRESETS["gpt3-175b"].to_profile(seq_len=2048).layers if x.kind == LayerKind.BLOCK
    )
    tp, i = 8, block.input_bytes
    megatron = block.act_tp_bytes / tp + block.act_replicated_bytes / tp
    kw = dict(tp=tp, sp=True, cp=1)
    assert layer_act_bytes(block, **kw, recompute=Recompute.NONE) == pytest.approx(megatron)
    torch_sp = layer_act_bytes(block, **kw, recompute=Recompute.NONE, saves_gathered=True)
    assert torch_sp == pytest.approx(megatron + 2 * i * (1 - 1 / tp))
    full = [
        layer_act_bytes(block, **kw, recompute=Recompute.FULL, saves_gathered=g)
        for g in (False, True)
    ]
    assert full == [pytest.approx(i / tp)] * 2
    no_sp = dict(tp=tp, sp=False, cp=1, recompute=Recompute.NONE)
    assert layer_act_bytes(block, **no_sp, saves_gathered=True) == layer_act_bytes(block, **no_sp)
