"""Megatron-Core's `moe` and `shared_experts` recompute modules (`--recompute-modules`): the bytes
each frees counted by hand from the model's sizes and Megatron-Core's saved tensors, the seconds
and all-to-alls each adds, and both carried from a Megatron configuration to the plan and back."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.judge import compare
from paraplan.export.megatron import read
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import RecomputeModule, TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.frameworks import RUNTIMES, Framework
from paraplan.planner.model import ModelProfile
from paraplan.planner.model_parse import parse_model
from paraplan.planner.strategy import Recompute, Strategy
from tests.export_cases import run_loaders

MOE = "moe:layers=4,hidden=1024,heads=8,kv_heads=2,vocab=32000,seq=2048,experts=8,top_k=2"
SEQ = 2048
CORE, LAYER, SHARED = (
    RecomputeModule.CORE_ATTN,
    RecomputeModule.MOE,
    RecomputeModule.SHARED_EXPERTS,
)


def _evaluate(
    profile: ModelProfile,
    modules: tuple[RecomputeModule, ...],
    *,
    tp: int = 1,
    sp: bool = False,
    ep: int = 1,
    seq: int = SEQ,
    recompute: Recompute = Recompute.SELECTIVE,
):
    runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=modules)
    train = TrainConfig(global_batch=8, seq_len=seq, runtime=runtime)
    s = Strategy(
        dp=8 // tp, tp=tp, pp=1, ep=ep, sequence_parallel=sp, micro_batch_size=1,
        recompute=recompute,
    )  # fmt: skip
    return Evaluator(profile, parse_cluster("8xh100"), train).evaluate(s)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, True)])
def test_moe_layer_bytes_counted_by_hand(tp: int, sp: bool) -> None:
    """4 MoE blocks (8 experts, top 2, SwiGLU experts of 4096), one micro-batch of 2048 bf16
    tokens on Megatron's runtime (fused SwiGLU): the checkpointed MoE layer keeps only its
    input, so each block frees the router's 8 probabilities and the two routed copies of the
    token after dispatch and before combine (2 x 2 x 1024, a sequence shard under SP), and
    per routed copy the experts' gate and up halves and the down projection's input
    (3 x 4096 / tp)."""
    profile = parse_model(MOE).to_profile(seq_len=SEQ)
    core = _evaluate(profile, (CORE,), tp=tp, sp=sp)
    layer = _evaluate(profile, (CORE, LAYER), tp=tp, sp=sp)
    h, f, k, experts, blocks = 1024, 4096, 2, 8, 4
    per_token = (2 * k * h + experts) / (tp if sp else 1) + k * 3 * f / tp
    freed = blocks * SEQ * per_token * 2
    acts = lambda e: e.memory.activations_bytes  # noqa: E731
    assert acts(core) - acts(layer) == pytest.approx(freed, rel=1e-9)
    # moe_act's activation output is part of the layer: not freed twice
    both = _evaluate(profile, (CORE, LAYER, RecomputeModule.MOE_ACT), tp=tp, sp=sp)
    assert acts(both) == pytest.approx(acts(layer), rel=1e-12)


def test_moe_layer_redoes_its_gemms_and_its_all_to_alls() -> None:
    """The recompute adds the router's and the experts' forward GEMMs, 2 h (8 + 2 x 3 x 4096)
    FLOPs per token: no faster than the dense bf16 peak, not ten times slower. Under EP 2 it
    also runs each MoE layer's dispatch and combine again: the exposed communication grows by
    half of the four all-to-alls per block the step runs anyway (EP 1 to EP 2 adds those four,
    and the data-parallel traffic, measured apart)."""
    profile = parse_model(MOE).to_profile(seq_len=SEQ)
    core, layer = _evaluate(profile, (CORE,)), _evaluate(profile, (CORE, LAYER))
    flops = 4 * SEQ * 2 * 1024 * (8 + 2 * 3 * 4096)
    peak = parse_cluster("8xh100").accelerator.peak_flops["bf16"]
    added = layer.time.recompute_s - core.time.recompute_s
    assert flops / peak < added < 10 * flops / peak
    assert layer.time.comm_s == core.time.comm_s  # EP 1: no all-to-all to redo
    ep_core, ep_layer = _evaluate(profile, (CORE,), ep=2), _evaluate(profile, (CORE, LAYER), ep=2)
    none_ep1 = _evaluate(profile, (CORE,), recompute=Recompute.NONE)
    none_ep2 = _evaluate(profile, (CORE,), ep=2, recompute=Recompute.NONE)
    full_ep1 = _evaluate(profile, (CORE,), recompute=Recompute.FULL)
    full_ep2 = _evaluate(profile, (CORE,), ep=2, recompute=Recompute.FULL)
    # selective recompute without `moe` runs the same four all-to-alls per block as none
    same = (none_ep2.time.comm_s - none_ep1.time.comm_s) - (ep_core.time.comm_s - core.time.comm_s)
    assert same == pytest.approx(0.0, abs=1e-15)
    # full recompute also redoes the dispatch and combine: the same two as `moe`
    two = (full_ep2.time.comm_s - full_ep1.time.comm_s) - (ep_core.time.comm_s - core.time.comm_s)
    assert ep_layer.time.comm_s - ep_core.time.comm_s == pytest.approx(two, rel=1e-9)
    assert two > 0


def _traced_deepseek(seq: int) -> ModelProfile:
    pytest.importorskip("transformers")
    from profiler.hf import profile_hf
    from tests.test_ep_dispatch import GROUPED

    return profile_hf({**GROUPED, "num_nextn_predict_layers": 0}, seq_len=seq)


def test_shared_experts_bytes_and_seconds() -> None:
    """`shared_experts` on a traced DeepSeek-style model (one dense block, two MoE blocks, one
    shared expert of 128, SwiGLU): each MoE block frees the shared expert's gate and up halves
    and down projection's input, 3 x 128 elements per token (Megatron's fused SwiGLU), and
    redoes its two GEMMs; `moe` already includes the shared experts, so naming both frees no
    more than `moe` alone; a dense model has none to free."""
    seq = 32
    profile = _traced_deepseek(seq)
    assert profile.shared_expert_ffn == 128 and sum(profile.moe_blocks) == 2
    core = _evaluate(profile, (CORE,), seq=seq)
    shared = _evaluate(profile, (CORE, SHARED), seq=seq)
    acts = lambda e: e.memory.activations_bytes  # noqa: E731
    assert acts(core) - acts(shared) == pytest.approx(2 * seq * 3 * 128 * 2, rel=1e-9)
    assert shared.time.recompute_s > core.time.recompute_s
    layer = _evaluate(profile, (CORE, LAYER), seq=seq)
    both = _evaluate(profile, (CORE, LAYER, SHARED), seq=seq)
    assert acts(both) == pytest.approx(acts(layer), rel=1e-12)
    assert both.time.recompute_s == pytest.approx(layer.time.recompute_s, rel=1e-12)
    dense = parse_model(
        "llama:layers=4,hidden=1024,heads=8,kv_heads=2,ffn=2816,vocab=32000,seq=2048"
    ).to_profile(seq_len=SEQ)
    assert acts(_evaluate(dense, (CORE, SHARED, LAYER))) == acts(_evaluate(dense, (CORE,)))


def test_megatron_reads_prices_and_writes_back_moe(tmp_path: Path) -> None:
    """`--recompute-modules moe layernorm` is read whole and priced (the configuration keeps
    less than with the attention core alone), written back by the export and accepted by
    Megatron-Core's own TransformerConfig; a name Megatron-Core does not know, and
    `shared_experts` beside `--moe-shared-expert-overlap`, are refused as Megatron-Core
    refuses them."""
    base = "--bf16 --seq-length 2048 --micro-batch-size 1 --global-batch-size 8 "
    text = base + "--recompute-granularity selective --recompute-modules moe layernorm"
    setup = read(text, world_size=8, source="mine.args")
    modules = (LAYER, RecomputeModule.LAYERNORM)
    assert setup.runtime_says is not None and setup.runtime_says.recompute_modules == modules
    with pytest.raises(ValueError, match="recomputes only core_attn"):
        read(text + " attention", world_size=8, source="mine.args")
    with pytest.raises(ValueError, match="moe-shared-expert-overlap"):
        read(
            base + "--moe-shared-expert-overlap --recompute-granularity selective "
            "--recompute-modules shared_experts",
            world_size=8,
            source="mine.args",
        )
    profile = parse_model(MOE).to_profile(seq_len=SEQ)
    cluster = parse_cluster("8xh100")
    runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=modules)
    train = TrainConfig(global_batch=8, seq_len=SEQ, runtime=runtime)
    mine = compare("mine.args", setup, profile, cluster, train, top_k=0).yours
    default = dataclasses.replace(train, runtime=RUNTIMES[Framework.MEGATRON])
    plain = compare("core.args", setup, profile, cluster, default, top_k=0).yours
    assert mine.predicted.memory_per_gpu_bytes < plain.predicted.memory_per_gpu_bytes
    out = export_plan(mine, Target.MEGATRON, Costing(profile, cluster, mine)).text
    assert "--recompute-modules moe layernorm" in out
    again = read(out, world_size=8, source="exported.args")
    assert again.runtime_says is not None and again.runtime_says.recompute_modules == modules
    if importlib.util.find_spec("megatron") is not None:  # megatron-core's TransformerConfig
        path = tmp_path / "exported.args"
        path.write_text(out)
        view = run_loaders("megatron", [{"path": str(path), "world_size": 8, "dp": 8}])[0]
        assert view["recompute_modules"] == ["moe", "layernorm"]
