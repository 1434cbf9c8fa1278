"""fp8 training as Transformer Engine runs it under Megatron-Core (`Float8Casts.
TRANSFORMER_ENGINE`, planner/cost/float8.py): each operand cast once per micro-batch in both
layouts, and the weights cast once per step, against the byte counts worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Float8Casts, Runtime, TrainConfig
from paraplan.planner.cost.compute import MEMORY_EFFICIENCY
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.float8 import float8_linears
from paraplan.planner.model_parse import parse_model
from paraplan.planner.strategy import Recompute, Schedule, Strategy
from tests.search_checks import assert_search_is_exact

TE = Runtime(fused_elementwise=True, fp8_casts=Float8Casts.TRANSFORMER_ENGINE)
TORCHAO = Runtime(fused_elementwise=True)
H100_BW = 3.35e12 * MEMORY_EFFICIENCY  # H100 SXM HBM3, datasheet


def _train(runtime: Runtime, batch: int = 64) -> TrainConfig:
    return TrainConfig(global_batch=batch, seq_len=8192, precision="fp8", runtime=runtime)


def test_each_operand_is_cast_once_in_both_layouts() -> None:
    """Per micro-batch, by hand: forward reads the input for its absolute max (2 bytes an
    element), then the fused cast-transpose reads it (2) and writes both fp8 layouts (1 + 1);
    backward does the same to the output gradient. The weight is not cast per micro-batch,
    nor is the saved input cast again (torchao's count, 5 + 5 per weight element, is gone)."""
    lin = float8_linears(parse_cluster("8xh100"), _train(TE), None)
    assert lin is not None
    m, n, k = 8192, 14336, 4096
    f, b = lin.gemm_train_s(lin.bf16, m, n, k)
    gf, gb = lin.fp8.gemm_train_s(m, n, k)
    assert f - gf == pytest.approx(6 * m * k / H100_BW, rel=0.01)
    assert b - gb == pytest.approx(6 * m * n / H100_BW, rel=0.01)
    torchao = float8_linears(parse_cluster("8xh100"), _train(TORCHAO), None)
    assert torchao is not None
    tf, tb = torchao.gemm_train_s(torchao.bf16, m, n, k)
    assert (tf - f) + (tb - b) == pytest.approx(
        (10 * k * n + 4 * m * k + 2 * m * n) / H100_BW, rel=0.01
    )


def _llama8b_block_weights() -> int:
    """Llama 3 8B's weights per block, from its published sizes (Meta's model card: hidden
    4096, 32 heads, 8 KV heads of 128, SwiGLU 14336): q, k, v, o, three MLP matrices, two norms."""
    h, kv, ffn = 4096, 8 * 128, 14336
    return h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h


@pytest.mark.parametrize("tp", [1, 2])
def test_weights_are_cast_once_per_step(tp: int) -> None:
    """The stage's once-per-step term grows by the weights of its 32 blocks (one TP rank's)
    read and cast in both layouts, 6 bytes each, whatever the number of micro-batches."""
    spec = parse_model("llama3-8b")
    profile = spec.to_profile(8192, act_bytes=2)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=8 // tp, tp=tp, pp=1, micro_batch_size=1, sequence_parallel=tp > 1)
    extra = []
    for batch in (8 // tp, 64 // tp):
        te = Evaluator(profile, cluster, _train(TE, batch)).stage_times(s)[0]
        ao = Evaluator(profile, cluster, _train(TORCHAO, batch)).stage_times(s)[0]
        extra.append(te.optimizer_s - ao.optimizer_s)
    want = 6 * 32 * _llama8b_block_weights() / tp / H100_BW
    assert extra[0] == pytest.approx(want, rel=2e-3)  # norms are not TP-sharded: within 0.1%
    assert extra[1] == pytest.approx(extra[0])


def test_transformer_engine_saves_more_the_more_micro_batches() -> None:
    """torchao casts every weight twice per micro-batch, Transformer Engine once per step: its
    advantage per step grows by the same amount with each micro-batch added (and it keeps
    fewer activations: the linear layers' inputs kept in fp8, below; but more static bytes, its
    cached fp8 weights, the last test)."""
    spec = parse_model("llama3-8b")
    profile = spec.to_profile(8192, act_bytes=2)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1)
    gains, mems = [], set()
    for batch in (8, 16, 24):
        te = Evaluator(profile, cluster, _train(TE, batch)).evaluate(s)
        ao = Evaluator(profile, cluster, _train(TORCHAO, batch)).evaluate(s)
        gains.append(ao.step_time_s - te.step_time_s)
        mems.add(te.memory.activations_bytes < ao.memory.activations_bytes)
    assert all(g > 0 for g in gains) and mems == {True}
    assert gains[2] - gains[1] == pytest.approx(gains[1] - gains[0], rel=0.02)
    assert gains[1] - gains[0] > 0


def test_bf16_is_priced_the_same_under_either_cast_model() -> None:
    """The cast model applies to fp8 training only."""
    spec = parse_model("llama3-8b")
    profile = spec.to_profile(8192, act_bytes=2)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=4, tp=2, pp=1, micro_batch_size=1, sequence_parallel=True)
    times = {
        Evaluator(
            profile,
            cluster,
            dataclasses.replace(_train(rt, 16), precision="bf16"),
        )
        .evaluate(s)
        .step_time_s
        for rt in (TE, TORCHAO)
    }
    assert len(times) == 1


@pytest.mark.parametrize(("recompute", "cut"), [(Recompute.NONE, True), (Recompute.FULL, False)])
def test_the_linear_layers_inputs_are_kept_in_fp8(recompute: Recompute, cut: bool) -> None:
    """Transformer Engine saves each linear layer's input in fp8 for backward: one byte an
    element less than bf16, by hand for Llama 3 8B at tp=2 with sequence parallelism (32 blocks,
    8192 tokens, one micro-batch in flight): the QKV and MLP inputs' sequence shards
    (2 x 4096 / 2) and the attention and SwiGLU outputs' TP shards ((4096 + 14336) / 2). Full
    recompute keeps only the block inputs, so nothing changes there."""
    profile = parse_model("llama3-8b").to_profile(8192, act_bytes=2)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=4, tp=2, pp=1, micro_batch_size=1, sequence_parallel=True, recompute=recompute)
    held = []
    for casts in (Float8Casts.TRANSFORMER_ENGINE, Float8Casts.TORCHAO):
        runtime = dataclasses.replace(TE, sp_saves_gathered_input=False, fp8_casts=casts)
        ev = Evaluator(profile, cluster, _train(runtime, batch=4))
        held.append(ev.memory(s)[0].activations_bytes)
    want = 32 * 8192 * (2 * 4096 / 2 + (4096 + 14336) / 2) if cut else 0.0
    assert held[1] - held[0] == pytest.approx(want, rel=1e-9, abs=1.0)


def test_search_under_transformer_engine_is_exact_against_brute_force() -> None:
    """With Transformer Engine's casts (weights once per step, fp8 inputs kept), the search over
    the whole priced space (per-layer recompute among it, on a GPU tight enough to need it)
    returns brute force's best."""
    profile = parse_model("gpt:layers=8,hidden=4096,heads=32,vocab=32000,seq=8192").to_profile(8192)
    train = dataclasses.replace(_train(TE, batch=16), memory_headroom=0.7)
    ev = Evaluator(profile, parse_cluster("8xh100"), train)
    everything = assert_search_is_exact(ev, ("", "tp=2,sp=true"))
    assert any(e.strategy.recompute == Recompute.PER_LAYER for e in everything[:20])


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 2)])
def test_cached_fp8_weights_stay_on_the_gpu_unless_the_weights_are_fp8(tp: int, pp: int) -> None:
    """Transformer Engine keeps each bf16 weight's fp8 copy, one byte in each layout, between
    micro-batches and steps (`Linear._fp8_workspaces`, filled when Megatron-Core passes
    `is_first_microbatch`): a stage holds 2 bytes per weight element of its blocks (one TP
    rank's, Llama 3 8B's published sizes by hand) more than under torchao, whose fp8 operands
    live only inside a GEMM; with fp8 primary weights (`fp8_all_gather`: Megatron-LM's
    `--fp8-param-gather`) nothing more. Only the static memory moves, not the step time."""
    profile = parse_model("llama3-8b").to_profile(8192, act_bytes=2)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=8 // (tp * pp), tp=tp, pp=pp, micro_batch_size=1, sequence_parallel=tp > 1)
    if pp > 1:
        s = dataclasses.replace(s, schedule=Schedule.ONE_F_ONE_B)
    fp8_params = dataclasses.replace(TE, fp8_all_gather=True)
    evs = {rt: Evaluator(profile, cluster, _train(rt)) for rt in (TE, TORCHAO, fp8_params)}
    stages = evs[TE].stage_model.stages(evs[TE].stage_model.layout_of(s))
    for stage in stages:
        other = {rt: ev.static_memory(s, stage).other_bytes for rt, ev in evs.items()}
        blocks = sum(1 for i in stage.layers if profile.layers[i].kind.name == "BLOCK")
        want = 2 * blocks * _llama8b_block_weights() / tp
        assert other[TE] - other[TORCHAO] == pytest.approx(want, rel=2e-3)  # norms: 0.1%
        assert other[fp8_params] == other[TORCHAO]
    assert evs[TE].memory(s)[0].total_bytes > evs[TORCHAO].memory(s)[0].total_bytes
