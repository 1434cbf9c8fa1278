"""The profiler's op graphs reach the ILP: `graph_from_profile` on traced models, an ILP solve on
a profiled MLP replayed by the simulator and compared with the chain DP, and `paraplan
checkpoint --solver ilp` on a profile JSON (CPU only; each ILP is small)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.planner.model import ModelProfile
from paraplan.planner.profile_io import save_profile
from paraplan.planner.remat_schedule import StepOp, load_schedule
from paraplan.planner.solvers import (
    ChainLayer,
    LayerChain,
    OpGraph,
    SolveStatus,
    graph_from_profile,
    simulate,
    solve_checkpoint_dp,
    solve_remat_ilp,
    store_all_ops,
)
from paraplan.profiler import profile

from .profiler_models import hf, plain

WIDTH = 128
"""Width of the profiler's test MLP (`profiler_models.mlp`): 6 Linear/ReLU pairs and a Linear
to 10 classes, fp32."""


@pytest.fixture(scope="module")
def mlp_profile() -> ModelProfile:
    model, inputs, loss_fn = plain("mlp")
    return profile(model, inputs, loss_fn=loss_fn, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def gpt2_profile() -> ModelProfile:
    model, inputs = hf("gpt2")
    return profile(model, inputs, repeats=0)


def path_chain(graph: OpGraph) -> LayerChain:
    """A path op graph as a chain (node l is layer l-1) whose store-all keeps at least what the
    graph's does: every layer keeps its input, and a node whose backward reads its own output
    keeps it as well (a second copy in the chain model)."""
    layers = []
    for i in graph.compute_nodes:
        node, prev = graph.nodes[i], graph.nodes[i - 1]
        assert node.inputs == (i - 1,), "not a path graph"
        layers.append(
            ChainLayer(
                name=node.name,
                fwd_s=node.fwd_s,
                bwd_s=node.bwd_s,
                input_bytes=prev.output_bytes,
                saved_bytes=prev.output_bytes + (node.output_bytes if node.bwd_output else 0.0),
                output_bytes=node.output_bytes,
            )
        )
    return LayerChain(layers=tuple(layers), name=graph.name)


def test_mlp_graph_has_one_node_per_tensor_making_op(mlp_profile: ModelProfile) -> None:
    graph = graph_from_profile(mlp_profile, micro_batch_size=2)
    ops = [graph.nodes[i].name.split(":")[1] for i in graph.compute_nodes]
    # 7 Linears (addmm; the weight transpose is a view) and 6 ReLUs, then cross-entropy.
    assert ops == ["addmm", "relu"] * 6 + ["addmm", "_log_softmax", "nll_loss_forward"]
    for i in graph.compute_nodes:
        node = graph.nodes[i]
        assert node.inputs == (i - 1,)
        if node.name.endswith(":addmm"):  # x @ W^T: the weight gradient reads x
            assert node.bwd_inputs == (i - 1,) and not node.bwd_output
        if node.name.endswith(":relu"):  # ReLU's backward reads its output only
            assert node.bwd_inputs == () and node.bwd_output
    # per row (the profile's "sequence"), times 2: 128 fp32 features, 10 logits
    assert graph.nodes[1].output_bytes == 2 * WIDTH * 4
    assert graph.nodes[13].output_bytes == 2 * 10 * 4
    # the layers' measured times are split over their ops, nothing lost
    layer_s = sum(x.fwd_time_s or 0.0 for x in mlp_profile.layers) * 2
    assert graph.store_all_makespan_s == pytest.approx(
        layer_s + sum(x.bwd_time_s or 0.0 for x in mlp_profile.layers) * 2, rel=1e-9
    )
    assert sum(graph.nodes[i].fwd_s for i in graph.compute_nodes) == pytest.approx(layer_s)


def test_ilp_on_a_profiled_path_graph_replays_and_never_loses_to_the_dp(
    mlp_profile: ModelProfile,
) -> None:
    graph = graph_from_profile(mlp_profile, micro_batch_size=4)
    chain = path_chain(graph)
    top = simulate(chain, store_all_ops(chain)).peak_bytes
    least = solve_checkpoint_dp(chain, 0.0).min_budget_bytes
    solved = 0
    for k in range(4):
        budget = least * 1.01 + (top - least * 1.01) * k / 3
        dp = solve_checkpoint_dp(chain, budget)
        ilp = solve_remat_ilp(graph, budget, time_limit_s=60)
        assert ilp.status == SolveStatus.OPTIMAL, ilp.message
        assert ilp.ops and ilp.peak_bytes is not None and ilp.makespan_s is not None
        replay = simulate(graph, ilp.ops)
        assert replay.peak_bytes == pytest.approx(ilp.peak_bytes, rel=1e-6)
        assert replay.peak_bytes <= budget * (1 + 1e-9)
        assert replay.makespan_s == pytest.approx(ilp.makespan_s, rel=1e-6)
        if dp.ops and dp.makespan_s is not None:
            solved += 1
            assert ilp.makespan_s <= dp.makespan_s * (1 + 1e-6)
    assert solved >= 3


def test_gpt2_graph_reads_what_autograd_saves(gpt2_profile: ModelProfile) -> None:
    block = graph_from_profile(gpt2_profile, layers=range(1, 2), seconds_per_flop=1e-12)
    by_op: dict[str, list[int]] = {}
    for i in block.compute_nodes:
        by_op.setdefault(block.nodes[i].name.split(":")[1], []).append(i)
    assert len(by_op["addmm"]) == 4 and len(by_op["bmm"]) == 2
    for i in by_op["addmm"]:  # every projection's weight gradient reads its activation input
        node = block.nodes[i]
        assert node.bwd_inputs == node.inputs and not node.bwd_output
    for i in by_op["bmm"]:  # QK^T and AV read both operands
        assert set(block.nodes[i].bwd_inputs) == set(block.nodes[i].inputs)
    assert all(block.nodes[i].bwd_output for i in by_op["_safe_softmax"] + by_op["tanh"])
    # the block's graph ends with its output, the residual add, of the block's output size
    last = block.nodes[block.compute_nodes[-1]]
    assert last.name.endswith(":add.Tensor")
    assert last.output_bytes == gpt2_profile.layers[1].output_bytes
    # the whole model chains the layers: 2 blocks of the same size, one loss at the end
    whole = graph_from_profile(gpt2_profile, seconds_per_flop=1e-12)
    blocks = [sum(1 for n in whole.nodes if n.name.startswith(f"block.{b}/")) for b in (0, 1)]
    assert blocks == [len(block.compute_nodes)] * 2
    assert whole.sinks() == (len(whole) - 1,)
    assert "nll_loss" in whole.nodes[-1].name


def test_graph_from_profile_needs_op_graphs_and_valid_layers(gpt2_profile: ModelProfile) -> None:
    bare = dataclasses.replace(gpt2_profile, op_graphs=())
    with pytest.raises(ValueError, match="no op graph for layer 0"):
        graph_from_profile(bare, seconds_per_flop=1e-12)
    with pytest.raises(ValueError, match="no measured layer times"):
        graph_from_profile(gpt2_profile)
    with pytest.raises(ValueError, match="layers=range"):
        graph_from_profile(gpt2_profile, layers=range(2, 9), seconds_per_flop=1e-12)
    with pytest.raises(ValueError, match="flops_per_byte=-1"):
        graph_from_profile(gpt2_profile, seconds_per_flop=1e-12, flops_per_byte=-1)


def test_checkpoint_command_solves_the_op_graph(
    mlp_profile: ModelProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mlp.json"
    save_profile(mlp_profile, path)
    graph = graph_from_profile(mlp_profile)
    top = simulate(graph, store_all_ops(graph)).peak_bytes
    out = tmp_path / "schedule.json"
    argv = ["checkpoint", "--model", str(path), "--solver", "ilp", "--budget", str(0.8 * top)]
    assert main([*argv, "-o", str(out)]) == 0
    schedule = load_schedule(out)
    # one entry per operation of the op graph, not per layer
    assert schedule.layers == tuple(n.name for n in graph.nodes[1:])
    assert schedule.peak_bytes <= 0.8 * top
    assert schedule.store_all_peak_bytes == pytest.approx(top)
    assert sum(schedule.recomputed) > 0
    assert sum(1 for s in schedule.steps if s.op == StepOp.BACKWARD) == len(graph.compute_nodes)
    assert "solver ilp" in capsys.readouterr().out
