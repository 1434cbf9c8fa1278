"""The solvers' shared model: chain and op-graph validation, the profile converter, and the
simulator against schedules whose peak and time are worked out by hand (fast, CPU only)."""

from __future__ import annotations

import pytest

from paraplan.planner.model_spec import PRESETS
from paraplan.planner.solvers import (
    Backward,
    ChainLayer,
    Forward,
    GraphOp,
    LayerChain,
    Offload,
    OpGraph,
    Prefetch,
    TensorPart,
    Wait,
    chain_from_profile,
    chain_to_graph,
    gpt2_block_graph,
    simulate,
)

SAV = TensorPart.SAVED


def _layer(name: str, **kw: float) -> ChainLayer:
    base = dict(fwd_s=1.0, bwd_s=2.0, input_bytes=10.0, saved_bytes=30.0, output_bytes=10.0)
    base.update(kw)
    return ChainLayer(name=name, **base)


def _uniform3() -> LayerChain:
    return LayerChain(layers=tuple(_layer(f"l{i}") for i in range(3)))


# ---- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"fwd_s": -1.0}, ["fwd_s=-1.0", ">= 0"]),
        ({"output_bytes": float("nan")}, ["output_bytes=nan", "finite"]),
        ({"saved_bytes": 5.0}, ["saved_bytes=5.0", "input_bytes=10.0", "add the input"]),
        ({"bwd_tmp_bytes": -2.0}, ["bwd_tmp_bytes=-2.0", "fix the profile"]),
    ],
)
def test_chain_layer_rejects_bad_values_naming_them(kw: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        _layer("bad", **kw)
    for word in words:
        assert word in str(err.value)


def test_chain_rejects_empty_and_mismatched_layers() -> None:
    with pytest.raises(ValueError, match=r"non-empty tuple.*pass at least one layer"):
        LayerChain(layers=())
    with pytest.raises(ValueError, match=r"input_bytes=20.0.*output_bytes=10.0.*make them equal"):
        LayerChain(layers=(_layer("a"), _layer("b", input_bytes=20.0, saved_bytes=20.0)))


def test_graph_rejects_forward_references_and_foreign_bwd_inputs() -> None:
    x = GraphOp(name="x", output_bytes=1.0, is_input=True)
    with pytest.raises(ValueError, match=r"earlier node.*topological order"):
        OpGraph(nodes=(x, GraphOp(name="a", output_bytes=1.0, inputs=(1,))))
    with pytest.raises(ValueError, match=r"bwd_inputs has 0.*not among inputs"):
        OpGraph(nodes=(x, GraphOp(name="a", output_bytes=1.0, inputs=(), bwd_inputs=(0,))))
    with pytest.raises(ValueError, match="has no inputs"):
        OpGraph(nodes=(x, GraphOp(name="a", output_bytes=1.0)))


def test_chain_from_profile_scales_gpt2_by_micro_batch() -> None:
    profile = PRESETS["gpt2"].to_profile(1024)
    chain = chain_from_profile(profile, micro_batch_size=4, seconds_per_flop=1e-12)
    assert len(chain) == len(profile.layers) == 14
    for layer, cost in zip(chain.layers, profile.layers, strict=True):
        assert layer.fwd_s == pytest.approx(cost.fwd_flops * 4 * 1e-12)
        assert layer.bwd_s == pytest.approx(cost.bwd_flops * 4 * 1e-12)
        assert layer.saved_bytes == pytest.approx(
            4 * (cost.act_tp_bytes + cost.act_replicated_bytes)
        )
        assert layer.input_bytes == 4 * cost.input_bytes
    # a GPT-2 block keeps 34·s·h + 5·a·s² bytes per sequence in 16-bit (Korthikanti et al. 2022
    # §4.1, dropout masks at one byte), its input included
    s, h, a = 1024, 768, 12
    assert chain.layers[1].saved_bytes == 4 * (34 * s * h + 5 * a * s * s)
    with pytest.raises(ValueError, match="seconds_per_flop=0"):
        chain_from_profile(profile, seconds_per_flop=0)
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        chain_from_profile(profile, micro_batch_size=0, seconds_per_flop=1e-12)


def test_gpt2_block_graph_saves_what_korthikanti_counts() -> None:
    b, s, h, a = 2, 1024, 768, 12
    g = gpt2_block_graph(batch=b, seq=s, hidden=h, heads=a)
    read = {i for j in g.compute_nodes for i, part in g.bwd_reads(j) if part == "output"}
    saved = sum(g.nodes[i].output_bytes for i in read)
    saved += sum(n.saved_extra_bytes for n in g.nodes)
    layer_norm_stats = 2 * (2 * b * s * 4)  # mean and rstd in fp32, two layer norms
    assert saved == 34 * s * b * h + 5 * a * s * s * b + layer_norm_stats


# ---- simulator: hand-worked schedules ---------------------------------------------------------
def test_store_all_peak_and_time_by_hand() -> None:
    # x0=10. F*1: +x1+a1 (10+20) = 40. F*2: 70. F*3: +30 -> 100, x3 (nobody reads) freed: 90.
    # B3: seed +10 = 100, grad of x2 +10 = 110 (peak); then seed, a3, x2 go: 70 ...
    ops = [Forward(node=i) for i in (1, 2, 3)] + [Backward(node=i) for i in (3, 2, 1)]
    result = simulate(_uniform3(), ops)
    assert result.peak_bytes == 110
    assert result.makespan_s == 9.0
    assert result.recompute_s == 0.0
    assert result.peak_op == 3


def test_checkpointing_peak_and_time_by_hand() -> None:
    # F1 (no keep): x0+x1 = 20; F2: x2 in, x1 out: 20; F*3: 50, x3 freed: 40 (x0, x2, a3);
    # B3: seed 50, grad x2 60, then 20 (x0, grad x2); F*1: 50; F*2: 80 (peak); x2 freed: 70...
    ops = [
        Forward(node=1, keep_saved=False),
        Forward(node=2, keep_saved=False),
        Forward(node=3),
        Backward(node=3),
        Forward(node=1),
        Forward(node=2),
        Backward(node=2),
        Backward(node=1),
    ]
    result = simulate(_uniform3(), ops)
    assert result.peak_bytes == 80
    assert result.makespan_s == 11.0
    assert result.recompute_s == 2.0


def _offload_chain() -> LayerChain:
    return LayerChain(layers=(_layer("l1", saved_bytes=50.0), _layer("l2", saved_bytes=10.0)))


def test_offload_frees_after_the_wait_and_prefetch_stalls_by_hand() -> None:
    # bandwidth 20 B/s. F*1 [0,1]: x0+x1+a1 = 60. Offload a1 (40 B) on the channel [1,3].
    # F*2 [1,2]: 70 (x2, freed after), then 60. Wait: now 3 (stall 1), a1 goes: 20.
    # B2 [3,5]: seed 30, grad x1 40; then x0 + grad x1 = 20. Prefetch a1 [5,7]: 60.
    # Wait: now 7 (stall 2). B1 [7,9]: grad x0 -> 70.
    ops = [
        Forward(node=1),
        Offload(node=1, part=SAV),
        Forward(node=2),
        Wait(),
        Backward(node=2),
        Prefetch(node=1, part=SAV),
        Wait(),
        Backward(node=1),
    ]
    result = simulate(_offload_chain(), ops, pcie_bytes_per_s=20.0)
    assert result.peak_bytes == 70
    assert result.makespan_s == 9.0
    assert result.stall_s == 3.0
    assert result.transfer_bytes == 80.0
    store_all = [Forward(node=1), Forward(node=2), Backward(node=2), Backward(node=1)]
    assert simulate(_offload_chain(), store_all).peak_bytes == 80  # offload saved 10 B


def test_sliced_offload_overlaps_several_operations() -> None:
    # Half of a1 (20 B at 20 B/s) under each of F*2 and B2; nothing stalls until the prefetch.
    ops = [
        Forward(node=1),
        Offload(node=1, part=SAV, fraction=0.5, release=False),
        Forward(node=2),
        Wait(),
        Offload(node=1, part=SAV, fraction=0.5),
        Backward(node=2),
        Wait(),
        Prefetch(node=1, part=SAV),
        Wait(),
        Backward(node=1),
    ]
    result = simulate(_offload_chain(), ops, pcie_bytes_per_s=20.0)
    # F*2 [1,2], channel [1,2]; B2 [2,4], channel [2,3]; prefetch [4,6] stalls 2; B1 [6,8]
    assert result.makespan_s == 8.0
    assert result.stall_s == 2.0
    # a1 is released only after B2's wait: B2 still sees it (x0, x1, a1, seed, grad x1 = 80)
    assert result.peak_bytes == 80


@pytest.mark.parametrize(
    ("ops", "words"),
    [
        ([Forward(node=1), Backward(node=1)], ["Backward l1", "consumers", "l2"]),
        ([Forward(node=1), Forward(node=2), Backward(node=2)], ["before the backward", "l1"]),
        (
            [
                Forward(node=1, keep_saved=False),
                Forward(node=2),
                Backward(node=2),
                Backward(node=1),
            ],
            ["l1.saved is not on the device"],
        ),
        ([Forward(node=1), Offload(node=1, part=SAV)], ["needs a transfer channel"]),
        ([Backward(node=2)], ["has not run its forward"]),
    ],
)
def test_invalid_schedules_are_rejected_with_the_operation(ops: list, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        simulate(_offload_chain(), ops)
    for word in words:
        assert word in str(err.value)


def test_recomputing_a_tensor_a_transfer_still_reads_is_refused() -> None:
    ops = [Forward(node=1), Offload(node=1, fraction=1.0, release=False), Forward(node=1)]
    with pytest.raises(ValueError, match=r"l1\.output is still on the device"):
        simulate(_offload_chain(), ops, pcie_bytes_per_s=1.0)


def test_autograd_state_holds_the_layer_input() -> None:
    # Layer 2 kept its saved state; recomputing its input x1 while that state lives is refused
    # (in PyTorch the saved tensors reference x1), so "store all" keeps the input, as Rotor.
    ops = [
        Forward(node=1, keep_saved=False),
        Forward(node=2),
        Forward(node=3),
        Forward(node=1, keep_saved=False),
        Backward(node=3),
        Backward(node=2),
        Backward(node=1),
    ]
    with pytest.raises(ValueError, match="held by the saved tensors of \\['l1'\\]"):
        simulate(_uniform3(), ops)
    graph = chain_to_graph(_uniform3())
    assert graph.holds(2) == (1,)
    assert graph.bwd_reads(2) == ((1, TensorPart.OUTPUT), (2, SAV))


def test_prefetch_needs_a_finished_offload() -> None:
    ops = [
        Forward(node=1),
        Offload(node=1, part=SAV, fraction=0.5, release=False),
        Wait(),
        Prefetch(node=1, part=SAV),
    ]
    with pytest.raises(ValueError, match="no host copy yet"):
        simulate(_offload_chain(), ops, pcie_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="slices add up to 1, and release comes with the last"):
        simulate(
            _offload_chain(),
            [Forward(node=1), Offload(node=1, part=SAV, fraction=0.5)],
            pcie_bytes_per_s=1.0,
        )
