"""Behaviours the cost model must show whatever its constants (issue: a cost model you can trust
at scale), and the published-runs validation within its recorded bounds."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.compute import KERNELS, KernelModel, Tile
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.hardware import get_accelerator
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.strategy import DEFAULT_MESH_ORDER, MeshAxis, Recompute, Strategy
from tests.benchmark_module import benchmark_module


def _best_zero3(model: str, gpus: int, batch: int, seq: int) -> float:
    """Tokens/s per GPU of the fastest pure ZeRO-3 strategy (tp = pp = cp = 1)."""
    profile = parse_model(model).to_profile(seq_len=seq)
    cluster = parse_cluster(f"{gpus}xa100-80gb")
    ev = Evaluator(profile, cluster, TrainConfig(global_batch=batch, seq_len=seq))
    pins = Pins(tp=1, pp=1, cp=1, zero_stage=3, offload_optimizer=False)
    best = Search(ev, pins).run(top_k=0).best
    assert best is not None
    return best.tokens_per_s / gpus


def test_zero3_throughput_per_gpu_falls_as_dp_grows_at_a_fixed_global_batch():
    """At a fixed global batch, more data-parallel ranks leave each GPU fewer tokens per
    micro-batch to hide the same per-unit gathers behind."""
    rates = [_best_zero3("gpt3-175b", n, 1536, 2048) for n in (384, 768, 1536)]
    assert rates[0] > rates[1] > rates[2]
    assert rates[2] < 0.9 * rates[0]


def test_cp_is_not_chosen_at_sequence_2048_on_one_node():
    """Context parallelism only pays where attention blocks are long enough to hide the K/V
    ring; a dense model at 2048 tokens on 8 GPUs uses DP/TP instead."""
    for model in ("llama3-8b", "gpt:layers=24,hidden=2048,heads=16,vocab=50304,seq=2048"):
        profile = parse_model(model).to_profile(seq_len=2048)
        ev = Evaluator(profile, parse_cluster("8xh100"), TrainConfig(global_batch=64, seq_len=2048))
        best = Search(ev).run(top_k=0).best
        assert best is not None and best.strategy.cp == 1, best.strategy.short()


def test_mesh_order_puts_tp_innermost_unless_pinned():
    profile = parse_model("llama3-70b").to_profile(seq_len=4096)
    ev = Evaluator(profile, parse_cluster("64xh100"), TrainConfig(global_batch=256, seq_len=4096))
    for e in Search(ev, Pins(tp=8)).run(top_k=3).ranked:
        assert e.strategy.mesh_order[-1] == MeshAxis.TP, e.strategy.short()
    # equal costs: the locality order wins over any order by name
    s = Strategy(dp=8, tp=8, pp=1)
    swapped = Strategy(
        dp=8, tp=8, pp=1, mesh_order=(MeshAxis.PP, MeshAxis.TP, MeshAxis.CP, MeshAxis.DP)
    )
    assert s.sort_key() < swapped.sort_key()
    assert s.mesh_order == DEFAULT_MESH_ORDER


def test_thin_gemms_run_below_the_large_gemm_rate():
    """Tile and wave quantization and the per-tile overhead (NVIDIA Matrix Multiplication
    Background guide §3): K = 512 GEMMs, and GEMMs a few tiles wide, reach a lower fraction of
    peak than 8192^3."""
    acc = get_accelerator("h100")
    k = KernelModel(acc, "bf16", KERNELS["h100"])

    def rate(m: int, n: int, kk: int) -> float:
        return 2 * m * n * kk / k.gemm_s(m, n, kk)

    big = rate(8192, 8192, 8192)
    assert big < acc.peak_flops_for("bf16")
    assert rate(8192, 8192, 512) < 0.92 * big
    assert rate(256, 256, 8192) < 0.5 * big  # 2 tiles on 132 SMs
    # wave quantization with one tile shape: 133 tiles take two waves of 132
    one = dataclasses.replace(KERNELS["h100"], tiles=(Tile(128, 128, 1.0),))
    k1 = KernelModel(acc, "bf16", one)
    full, spill = k1.gemm_s(128 * 12, 128 * 11, 4096), k1.gemm_s(128 * 12 + 1, 128 * 11, 4096)
    assert spill == pytest.approx(2 * full, rel=1e-9)


def test_causal_flash_attention_executes_half_the_dense_flops():
    acc = get_accelerator("a100-80gb")
    k = KernelModel(acc, "bf16", KERNELS["a100-80gb"])
    causal_f, causal_b = k.attention_s(1e12, causal=True)
    dense_f, _ = k.attention_s(1e12, causal=False)
    assert causal_f == pytest.approx(dense_f / 2)
    assert causal_b == pytest.approx(2.5 * causal_f)


def _validation():
    return benchmark_module("validate_published")


@pytest.mark.slow
def test_published_runs_within_the_recorded_bounds():
    """The validation suite (benchmarks/validate_published.py) meets the issue's target on the
    held-out rows (mean |error| <= 5%, max <= 10%), stays within docs/validation.md's recorded
    figure on the fitted rows, and every published pair keeps its order (the fp8 rows against
    their bf16 runs among them). The fp8 rows, priced by a mechanism added after the constants
    were fitted and fitted on nothing, stay within docs/validation.md's recorded figures: mean
    11.3%, max 37.8% since the twenty-eighth session, when Qwen3-30B-A3B's HybridEP dispatch
    was priced once per node (+21.0% -> -37.8%; docs/validation.md says why it was kept)."""
    vp = _validation()
    results, _ = vp.run()
    fit, held, fp8, _window, _long = vp.groups(results)
    assert held.rows >= 15 and fit.rows >= 25 and fp8.rows >= 12
    assert held.mean_abs_error <= 0.05
    assert held.max_abs_error <= 0.10
    assert fit.mean_abs_error <= 0.06
    assert fp8.mean_abs_error <= 0.12 and fp8.max_abs_error <= 0.40
    assert all(ok for _, _, ok in vp.pair_orders(results))


def test_hsdp_keeps_the_gathers_in_the_node_and_pays_in_memory():
    """HSDP (FSDP §3.2.2): sharding Llama 3 8B over one node of 8 and replicating across 16
    nodes moves the per-unit gathers and reduce-scatters onto NVLink, which exposes less
    communication than sharding over all 128 ranks at a small micro-batch (its fp32 gradient
    all-reduce across the replicas included; the step as a whole is then within 1%: each rank
    also steps 16x the optimizer states); the parameter shard grows 16-fold (1/8 of the
    parameters in bf16 instead of 1/128)."""
    seq = 8192
    profile = parse_model("llama3-8b").to_profile(seq_len=seq)
    ev = Evaluator(profile, parse_cluster("128xh100"), TrainConfig(global_batch=128, seq_len=seq))
    base = Strategy(dp=128, tp=1, pp=1, zero_stage=3, micro_batch_size=1, recompute=Recompute.FULL)
    fsdp, hsdp = ev.evaluate(base), ev.evaluate(dataclasses.replace(base, dp_shard=8))
    assert hsdp.time.comm_s < fsdp.time.comm_s
    assert hsdp.step_time_s == pytest.approx(fsdp.step_time_s, rel=0.01)
    dense = sum(x.params for x in profile.layers)
    grown = hsdp.memory.params_bytes - fsdp.memory.params_bytes
    assert grown == pytest.approx(dense * 2 * (1 / 8 - 1 / 128), rel=0.01)
    assert "hsdp=16x8" in hsdp.strategy.short()


def test_eager_elementwise_and_tp_overlap_move_the_step_the_right_way():
    """The runtime matters: eager PyTorch (one kernel per operator) is slower than fused
    kernels by the extra bytes its norms, rotary and activations stream; overlapping TP
    collectives with GEMMs (Megatron's --tp-comm-overlap) is faster than exposing them, and
    never faster than the compute alone."""
    from paraplan.planner.config import Runtime

    seq = 4096
    profile = parse_model("llama3-8b").to_profile(seq_len=seq)
    s = Strategy(dp=1, tp=8, pp=1, sequence_parallel=True, micro_batch_size=1)

    def step(runtime: Runtime):
        train = TrainConfig(global_batch=8, seq_len=seq, runtime=runtime)
        return Evaluator(profile, parse_cluster("8xh100"), train).evaluate(s).time

    eager, fused = step(Runtime()), step(Runtime(fused_elementwise=True))
    overlap = step(Runtime(fused_elementwise=True, tp_comm_overlap=True))
    assert eager.compute_s > fused.compute_s
    assert eager.comm_s == pytest.approx(fused.comm_s)
    assert overlap.comm_s < fused.comm_s
    assert overlap.step_time_s >= fused.compute_s
