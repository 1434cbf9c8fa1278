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
from paraplan.planner.cost.comm import AxisLink, Collectives, link_of, place_axes
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.memory import (
    in_flight_microbatches,
    layer_act_bytes,
    model_state_bytes,
)
from paraplan.planner.hardware import get_accelerator, with_calibration
from paraplan.planner.model import LayerKind
from paraplan.planner.model_spec import PRESETS, Attention, Norm, TransformerSpec, parse_model
from paraplan.planner.strategy import MeshAxis, Recompute, Schedule, Strategy

GB = 1e9  # ZeRO's Figure 1 prints decimal gigabytes

# --- ZeRO model states (Rajbhandari et al. 2019, Figure 1) -----------------------------------

ZERO_PSI = 7.5e9  # parameters
ZERO_ND = 64  # data-parallel degree
# Mixed-precision Adam: 2 bytes of fp16 params + 2 of grads + K = 12 of optimizer states.
ZERO_FIGURE_1_GB = {0: 120.0, 1: 31.41, 2: 16.64, 3: 1.875}


def _mixed_adam() -> TrainConfig:
    return TrainConfig(global_batch=1, seq_len=1, precision="bf16", optimizer="adamw")


@pytest.mark.parametrize(("stage", "expected_gb"), ZERO_FIGURE_1_GB.items())
def test_zero_figure_1_model_states(stage, expected_gb):
    parts = model_state_bytes(ZERO_PSI, shard_ranks=ZERO_ND, zero_stage=stage, train=_mixed_adam())
    total = sum(parts)
    if stage in (1, 2):  # the figure rounds these two
        assert total / GB == pytest.approx(expected_gb, rel=1e-3)
    else:
        assert total / GB == expected_gb


def test_zero_stages_shard_states_grads_then_params():
    # §5: P_os shards the 12-byte optimizer states, P_g also the 2-byte grads, P_p the params.
    psi, nd = ZERO_PSI, ZERO_ND
    expected = {
        0: (2 * psi, 2 * psi, 12 * psi),
        1: (2 * psi, 2 * psi, 12 * psi / nd),
        2: (2 * psi, 2 * psi / nd, 12 * psi / nd),
        3: (2 * psi / nd, 2 * psi / nd, 12 * psi / nd),
    }
    for stage, parts in expected.items():
        got = model_state_bytes(psi, shard_ranks=nd, zero_stage=stage, train=_mixed_adam())
        assert got == pytest.approx(parts, rel=1e-12), stage


def test_zero_offload_moves_the_optimizer_states_off_the_gpu():
    params, grads, optimizer = model_state_bytes(
        ZERO_PSI, shard_ranks=ZERO_ND, zero_stage=2, train=_mixed_adam(), offload_optimizer=True
    )
    assert optimizer == 0.0
    assert (params, grads) == pytest.approx((2 * ZERO_PSI, 2 * ZERO_PSI / ZERO_ND), rel=1e-12)


def test_fp32_sgd_model_states():
    # fp32 training keeps no master copy: 4 bytes params + 4 grads + 4 momentum.
    train = TrainConfig(global_batch=1, seq_len=1, precision="fp32", optimizer="sgd")
    parts = model_state_bytes(1e9, shard_ranks=8, zero_stage=0, train=train)
    assert parts == pytest.approx((4e9, 4e9, 4e9), rel=1e-12)


def test_zero_stage_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="zero_stage=4"):
        model_state_bytes(1e9, shard_ranks=8, zero_stage=4, train=_mixed_adam())


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


# --- collectives (Thakur, Rabenseifner & Gropp 2005) ------------------------------------------

H100_NVLINK_BW = 900e9 / 2  # H100 SXM datasheet: 900 GB/s NVLink, both directions summed
H100_NET_BW = 400e9 / 8  # DGX H100: one 400 Gb/s NIC per GPU -> 50 GB/s


def test_h100_link_figures_are_the_datasheets():
    acc = get_accelerator("h100")
    assert acc.intra_node_bw_bytes_per_s == H100_NVLINK_BW
    assert acc.inter_node_bw_bytes_per_s == H100_NET_BW


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("nbytes", [1e6, 1.5e9])
def test_ring_all_reduce_inside_a_node(n, nbytes):
    acc = get_accelerator("h100")
    lat = acc.intra_node_latency_s
    got = Collectives(acc).all_reduce(nbytes, AxisLink(n, n, 1))
    expected = 2 * (n - 1) / n * nbytes / H100_NVLINK_BW + 2 * (n - 1) * lat
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_gather_and_reduce_scatter_inside_a_node(n):
    acc = get_accelerator("h100")
    lat, nbytes = acc.intra_node_latency_s, 3e8
    coll = Collectives(acc)
    expected = (n - 1) / n * nbytes / H100_NVLINK_BW + (n - 1) * lat
    assert coll.all_gather(nbytes, AxisLink(n, n, 1)) == pytest.approx(expected, rel=1e-12)
    assert coll.reduce_scatter(nbytes, AxisLink(n, n, 1)) == pytest.approx(expected, rel=1e-12)


def test_hierarchical_all_reduce_across_nodes():
    # 16 ranks on 2 nodes of 8: intra-node ring over 8, then an inter-node ring over 2 on a
    # 1/8 shard per GPU (each GPU on its own NIC), written out as the module docstring says.
    acc = get_accelerator("h100")
    nbytes = 1e9
    lat_in, lat_out = acc.intra_node_latency_s, acc.inter_node_latency_s
    expected = 2 * (7 / 8 * nbytes / H100_NVLINK_BW + 7 * lat_in) + 2 * (
        1 / 2 * (nbytes / 8) / H100_NET_BW + 1 * lat_out
    )
    got = Collectives(acc).all_reduce(nbytes, AxisLink(16, 8, 2))
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("acc_name", ["h100", "a100-80gb", "l4", "mi300x"])
def test_groups_spanning_nodes_are_slower(acc_name):
    coll = Collectives(get_accelerator(acc_name))
    nbytes = 5e8
    inside = AxisLink(8, 8, 1)
    for spanning in (AxisLink(8, 4, 2), AxisLink(8, 2, 4), AxisLink(8, 1, 8)):
        assert coll.all_reduce(nbytes, spanning) > coll.all_reduce(nbytes, inside)
        assert coll.all_gather(nbytes, spanning) > coll.all_gather(nbytes, inside)
        assert coll.all_to_all(nbytes, spanning) > coll.all_to_all(nbytes, inside)
    assert coll.p2p(nbytes, cross_node=True) > coll.p2p(nbytes, cross_node=False)


def test_single_rank_groups_cost_nothing():
    coll = Collectives(get_accelerator("h100"))
    one = AxisLink(1, 1, 1)
    assert coll.all_reduce(1e9, one) == 0.0
    assert coll.all_gather(1e9, one) == 0.0
    assert coll.all_to_all(1e9, one) == 0.0


def test_link_placement_on_8_gpu_nodes():
    # TP innermost (stride 1) stays in a node; DP with stride 8 has one rank per node.
    assert link_of(8, 1, 8) == AxisLink(8, 8, 1)
    assert link_of(4, 8, 8) == AxisLink(4, 1, 4)
    # 4 ranks at stride 4: ranks 0, 4 | 8, 12 -> two per node on two nodes.
    assert link_of(4, 4, 8) == AxisLink(4, 2, 2)
    assert link_of(1, 8, 8) == AxisLink(1, 1, 1)


def test_axis_strides_follow_the_mesh_order():
    sizes = {MeshAxis.PP: 2, MeshAxis.DP: 4, MeshAxis.CP: 1, MeshAxis.TP: 8}
    placed = place_axes(sizes, (MeshAxis.PP, MeshAxis.DP, MeshAxis.CP, MeshAxis.TP), 8)
    # The last axis varies fastest: tp stride 1, cp 8, dp 8, pp 32.
    assert placed == {
        MeshAxis.TP: (8, 1),
        MeshAxis.CP: (1, 8),
        MeshAxis.DP: (4, 8),
        MeshAxis.PP: (2, 32),
    }


def _worst_group(
    sizes: dict[MeshAxis, int], order: tuple[MeshAxis, ...], gpus_per_node: int, axis: MeshAxis
) -> tuple[int, int]:
    """(ranks per node, nodes) of the `axis` group that spans the most nodes, by enumerating
    the ranks: the last axis of `order` varies fastest, rank r sits on node r // G."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for coords in itertools.product(*(range(sizes[a]) for a in order)):
        rank = 0
        for a, c in zip(order, coords, strict=True):
            rank = rank * sizes[a] + c
        key = tuple(c for a, c in zip(order, coords, strict=True) if a != axis)
        groups.setdefault(key, []).append(rank)
    worst = (sizes[axis], 1)
    for ranks in groups.values():
        nodes = {r // gpus_per_node for r in ranks}
        if len(nodes) > worst[1]:
            worst = (len(ranks) // len(nodes), len(nodes))
    return worst


ORDERS = [
    (MeshAxis.PP, MeshAxis.DP, MeshAxis.CP, MeshAxis.TP),
    (MeshAxis.PP, MeshAxis.TP, MeshAxis.CP, MeshAxis.DP),
    (MeshAxis.TP, MeshAxis.PP, MeshAxis.DP, MeshAxis.CP),
    (MeshAxis.DP, MeshAxis.CP, MeshAxis.TP, MeshAxis.PP),
]


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(map(str, o)) for o in ORDERS])
@pytest.mark.parametrize("gpus_per_node", [2, 4, 8, 16])
def test_link_of_matches_enumerated_placement(order, gpus_per_node):
    sizes = {MeshAxis.PP: 2, MeshAxis.DP: 4, MeshAxis.CP: 2, MeshAxis.TP: 4}
    placed = place_axes(sizes, order, gpus_per_node)
    for axis, (size, stride) in placed.items():
        per_node, nodes = _worst_group(sizes, order, gpus_per_node, axis)
        assert link_of(size, stride, gpus_per_node) == AxisLink(size, per_node, nodes), axis


def test_groups_straddling_a_node_boundary_are_not_intra_node():
    # 12 GPUs in nodes of 6 (e.g. Summit's 6-GPU nodes); dp=3 x tp=4, tp innermost:
    # tp groups are ranks 0-3 (node 0), 4-7 (nodes 0 and 1), 8-11 (node 1).
    spec = parse_model("llama:layers=2,hidden=512,heads=8,vocab=1000,seq=512")
    cluster = parse_cluster("12xh100", gpus_per_node=6)
    ev = Evaluator(spec.to_profile(), cluster, TrainConfig(global_batch=12, seq_len=512))
    s = Strategy(dp=3, tp=4, pp=1)
    sizes = {MeshAxis.PP: 1, MeshAxis.DP: 3, MeshAxis.CP: 1, MeshAxis.TP: 4}
    assert _worst_group(sizes, s.mesh_order, 6, MeshAxis.TP) == (2, 2)
    assert ev.links(s)["tp"].nodes == 2


@pytest.mark.parametrize(
    "calibration",
    [{}, {"inter_node_bw_bytes_per_s": 2e11}, {"inter_node_bw_bytes_per_s": 1e12}],
    ids=["catalog", "network-faster-than-pcie", "network-much-faster"],
)
@pytest.mark.parametrize("acc_name", ["h100", "h100-pcie", "l4"])
def test_lower_bound_collectives_never_exceed_real_ones(acc_name, calibration):
    # The search prunes with these: a "lower bound" above the real time loses the optimum.
    acc = with_calibration(get_accelerator(acc_name), calibration)
    real, bound = Collectives(acc), Collectives(acc, lower_bound=True)
    for link in (AxisLink(8, 8, 1), AxisLink(8, 4, 2), AxisLink(16, 2, 8), AxisLink(4, 1, 4)):
        ideal = AxisLink(link.size, link.size, 1)
        for nbytes in (1e3, 1e8):
            assert bound.all_reduce(nbytes, ideal) <= real.all_reduce(nbytes, link)
            assert bound.all_gather(nbytes, ideal) <= real.all_gather(nbytes, link)
            assert bound.all_to_all(nbytes, ideal) <= real.all_to_all(nbytes, link)
    for cross in (False, True):
        assert bound.p2p(1e8, False) <= real.p2p(1e8, cross)


def test_evaluator_links_for_tp_inside_and_dp_across_nodes():
    profile = PRESETS["gpt2"].to_profile(seq_len=1024)
    ev = Evaluator(profile, parse_cluster("32xh100"), TrainConfig(global_batch=32, seq_len=1024))
    # gpt2 has 12 heads: tp=4 inside a node, dp=8 spans the 4 nodes (2 ranks per node).
    links = ev.links(Strategy(dp=8, tp=4, pp=1))
    assert links["tp"] == AxisLink(4, 4, 1)
    assert links["dp"] == AxisLink(8, 2, 4)
    # Swapping the order puts dp inside the node and tp across nodes.
    swapped = Strategy(
        dp=8, tp=4, pp=1, mesh_order=(MeshAxis.PP, MeshAxis.TP, MeshAxis.CP, MeshAxis.DP)
    )
    links = ev.links(swapped)
    assert links["dp"] == AxisLink(8, 8, 1)
    assert links["tp"] == AxisLink(4, 1, 4)


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
        (llama_ev, Strategy(dp=2, tp=4, pp=2, schedule=Schedule.ONE_F_ONE_B)),
    ):
        totals = [ev.memory(replace(base, zero_stage=z))[0] for z in (0, 1, 2)]
        assert totals[0].optimizer_bytes > totals[1].optimizer_bytes
        assert totals[1].grads_bytes > totals[2].grads_bytes
        assert totals[0].total_bytes > totals[1].total_bytes > totals[2].total_bytes
        z3 = ev.memory(replace(base, zero_stage=3))[0]
        assert z3.params_bytes < totals[2].params_bytes


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
        unsharded = (dense + expert / ep) * (2 * 2 + 2)  # bf16 params x 2 + bf16 grads
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
    totals = ev.memory_totals(strategy, choices)
    assert len(totals) == len(choices)
    for (sp, zero, off, rc), total in zip(choices, totals, strict=True):
        s = replace(
            strategy, sequence_parallel=sp, zero_stage=zero, offload_optimizer=off, recompute=rc
        )
        assert not ev.violation(s), s
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
    message = gpt2_ev.violation(strategy)
    assert message, rule
    assert named in message
    with pytest.raises(ValueError, match="not valid"):
        gpt2_ev.evaluate(strategy)


def test_cp_must_split_the_sequence_evenly():
    spec = parse_model("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=1000")
    ev = Evaluator(
        spec.to_profile(), parse_cluster("8xh100"), TrainConfig(global_batch=8, seq_len=1000)
    )
    # 1000 is not divisible by 2 * 8 (causal load balancing splits it in 2*cp chunks).
    assert "cp=8" in ev.violation(Strategy(dp=1, tp=1, pp=1, cp=8, micro_batch_size=8))
    assert ev.violation(Strategy(dp=2, tp=1, pp=1, cp=4, micro_batch_size=4)) == ""


def test_valid_strategies_have_no_violation(gpt2_ev):
    for s in (
        Strategy(dp=8, tp=1, pp=1),
        Strategy(dp=2, tp=4, pp=1, sequence_parallel=True, zero_stage=3, offload_optimizer=True),
        Strategy(dp=2, tp=1, pp=4, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=3),
    ):
        assert gpt2_ev.violation(s) == ""
