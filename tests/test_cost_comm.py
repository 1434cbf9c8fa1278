"""Communication: ring collectives, hierarchy across nodes, and where mesh axes land.

Expected values are written out from the formulas or the datasheets, never taken from the code
under test.
"""

from __future__ import annotations

import itertools

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.comm import (
    BUS_EFFICIENCY_INTER,
    BUS_EFFICIENCY_INTRA,
    HALF_BANDWIDTH_BYTES_INTER,
    HALF_BANDWIDTH_BYTES_INTRA,
    AxisLink,
    Collectives,
    link_of,
    place_axes,
)
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.hardware import get_accelerator, with_calibration
from paraplan.planner.model_parse import parse_model
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.strategy import MeshAxis, Strategy

# --- collectives (Thakur, Rabenseifner & Gropp 2005) ------------------------------------------

H100_NVLINK_BW = 900e9 / 2  # H100 SXM datasheet: 900 GB/s NVLink, both directions summed
H100_NET_BW = 400e9 / 8  # DGX H100: one 400 Gb/s NIC per GPU -> 50 GB/s


INTRA_BW = H100_NVLINK_BW * BUS_EFFICIENCY_INTRA  # NCCL bus bandwidth over NVLink
INTER_BW = H100_NET_BW * BUS_EFFICIENCY_INTER  # ... and over each GPU's NIC


def _ring_s(nbytes: float, n: int, passes: int, bw: float, lat: float, half: float) -> float:
    """A ring written out as docs/cost-model.md §5 says: passes*(n-1)/n of the bytes at the bus
    bandwidth, and passes*(n-1) steps each paying its latency plus half_bytes / bw (a step of
    S/n bytes runs at bw * (S/n) / (S/n + half))."""
    return passes * (n - 1) / n * nbytes / bw + passes * (n - 1) * (lat + half / bw)


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
    expected = _ring_s(nbytes, n, 2, INTRA_BW, lat, HALF_BANDWIDTH_BYTES_INTRA)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_gather_and_reduce_scatter_inside_a_node(n):
    acc = get_accelerator("h100")
    lat, nbytes = acc.intra_node_latency_s, 3e8
    coll = Collectives(acc)
    expected = _ring_s(nbytes, n, 1, INTRA_BW, lat, HALF_BANDWIDTH_BYTES_INTRA)
    assert coll.all_gather(nbytes, AxisLink(n, n, 1)) == pytest.approx(expected, rel=1e-12)
    assert coll.reduce_scatter(nbytes, AxisLink(n, n, 1)) == pytest.approx(expected, rel=1e-12)


def test_hierarchical_all_reduce_across_nodes():
    # 16 ranks on 2 nodes of 8: intra-node ring over 8, then an inter-node ring over 2 on a
    # 1/8 shard per GPU (each GPU on its own NIC), written out as the module docstring says.
    acc = get_accelerator("h100")
    nbytes = 1e9
    lat_in, lat_out = acc.intra_node_latency_s, acc.inter_node_latency_s
    shard = nbytes / 8
    intra = _ring_s(nbytes, 8, 2, INTRA_BW, lat_in, HALF_BANDWIDTH_BYTES_INTRA)
    # between 2 nodes NCCL's tree beats the ring: the shard pipelined at the bus bandwidth its
    # size reaches, 2 * log2(2) = 2 steps deep
    tree = 2 * 1 / 2 * (shard + HALF_BANDWIDTH_BYTES_INTER) / INTER_BW + 2 * lat_out
    ring = _ring_s(shard, 2, 2, INTER_BW, lat_out, HALF_BANDWIDTH_BYTES_INTER)
    assert tree < ring
    expected = intra + tree
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


def test_sync_skew_is_paid_once_per_collective_never_in_bounds():
    """`Calibration.sync_skew_s` (profiler/microbench_skew.py): each collective waits once for
    the slower rank, whatever its size or its ring's steps; one rank waits for no one, and the
    search's lower-bound collectives stay a bound."""
    acc, skew = get_accelerator("cpu"), 3.4e-4
    plain, skewed = Collectives(acc), Collectives(acc, sync_skew_s=skew)
    bound = Collectives(acc, lower_bound=True, sync_skew_s=skew)
    for n in (2, 4):
        link = AxisLink(n, n, 1)
        for nbytes in (4.0, 1e8):
            for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
                base = getattr(plain, name)(nbytes, link)
                assert getattr(skewed, name)(nbytes, link) == pytest.approx(base + skew)
                assert getattr(bound, name)(nbytes, link) <= base
            assert skewed.p2p(nbytes, False) == pytest.approx(plain.p2p(nbytes, False) + skew)
    assert skewed.all_reduce(1e9, AxisLink(1, 1, 1)) == 0.0


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
    assert ev.links(s).tp.nodes == 2


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
    assert links.tp == AxisLink(4, 4, 1)
    assert links.dp == AxisLink(8, 2, 4)
    # Swapping the order puts dp inside the node and tp across nodes.
    swapped = Strategy(
        dp=8, tp=4, pp=1, mesh_order=(MeshAxis.PP, MeshAxis.TP, MeshAxis.CP, MeshAxis.DP)
    )
    links = ev.links(swapped)
    assert links.dp == AxisLink(8, 8, 1)
    assert links.tp == AxisLink(4, 1, 4)
