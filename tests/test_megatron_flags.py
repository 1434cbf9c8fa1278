"""What a Megatron configuration says of its runtime beyond degrees: the data-parallel overlap
flags (priced exposed without them, written by the export, taken by megatron-core's DDP config)
and the context-parallel communication type."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.judge import compare
from paraplan.export.megatron import read
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.frameworks import RUNTIMES, Framework
from paraplan.planner.model_parse import parse_model
from tests.export_cases import run_loaders


def test_megatron_data_parallel_overlap_flags(tmp_path: Path) -> None:
    """Megatron-LM overlaps the data-parallel traffic only with `--overlap-grad-reduce` and
    `--overlap-param-gather`: a configuration with both is priced as Megatron's runtime (which
    the export writes them for, and megatron-core's DDP config takes); without them its
    gradient reduce-scatter and parameter all-gather (ZeRO-1, Llama 3 8B over 16 ranks) are
    exposed: slower by more than nothing and by less than the two collectives' bytes at the
    catalog's network bandwidth, halved (what was hidden)."""
    cluster = parse_cluster("16xh100")
    profile = parse_model("llama3-8b").to_profile(seq_len=4096)
    base = (
        "--bf16 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 "
        "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform "
    )
    plans = {}
    for name, flags in (("on", "--overlap-grad-reduce --overlap-param-gather"), ("off", "")):
        setup = read(base + flags, world_size=16, source=f"{name}.args")
        assert setup.runtime_says is not None
        runtime = setup.runtime_says.apply(RUNTIMES[Framework.MEGATRON])
        train = TrainConfig(global_batch=64, seq_len=4096, runtime=runtime)
        plans[name] = compare(name, setup, profile, cluster, train, top_k=0).yours
        assert (runtime == RUNTIMES[Framework.MEGATRON]) == (name == "on")
    on, off = plans["on"].predicted, plans["off"].predicted
    extra = off.step_time_s - on.step_time_s
    params = profile.num_params
    moved = params * (2 + 4) * 15 / 16  # a ring's bf16 gather and fp32 reduce-scatter
    bound = moved / (cluster.accelerator.inter_node_bw_bytes_per_s * 0.5)  # at half the NIC
    assert 0 < extra < bound
    # both collectives hide wholly under compute when overlapped, costing OVERLAP_CONTENTION
    # of their time there; exposed, all of it (nothing else communicates: no TP, no PP)
    assert off.time_breakdown.comm_s == pytest.approx(on.time_breakdown.comm_s / 0.5, rel=1e-9)
    out = export_plan(plans["on"], Target.MEGATRON, Costing(profile, cluster, plans["on"])).text
    assert "--overlap-grad-reduce" in out and "--overlap-param-gather" in out
    if importlib.util.find_spec("megatron") is not None:
        path = tmp_path / "on.args"
        path.write_text(out)
        view = run_loaders("megatron", [{"path": str(path), "world_size": 16, "dp": 16}])[0]
        assert view["dp_overlap"] == [True, True]


def test_cp_comm_type_other_than_the_ring_is_noted() -> None:
    """Megatron's `--cp-comm-type a2a` (heads exchanged all-to-all, as gpt-oss's recipe sets for
    CP) is not the ring paraplan prices: read, and said so."""
    base = "--bf16 --seq-length 8192 --context-parallel-size 2 --micro-batch-size 1 "
    ring = read(base, world_size=8, source="ring.args")
    a2a = read(base + "--cp-comm-type a2a", world_size=8, source="a2a.args")
    assert not any("cp-comm-type" in n for n in ring.notes)
    assert any("--cp-comm-type a2a priced as p2p" in n for n in a2a.notes)


def test_odd_pipeline_and_recompute_flags() -> None:
    """A negative first-stage count is refused naming the flag; `--recompute-modules` given
    with no module (Megatron-LM's nargs="*": an empty list) recomputes nothing."""
    base = "--pipeline-model-parallel-size 4 --bf16 --seq-length 4096 --micro-batch-size 1 "
    with pytest.raises(
        ValueError, match="--decoder-first-pipeline-num-layers -3 must be at least 0"
    ):
        read(base + "--decoder-first-pipeline-num-layers -3", world_size=16, source="a.args")
    empty = read(
        base + "--recompute-granularity selective --recompute-modules", world_size=16, source="b"
    )
    assert empty.runtime_says is not None and empty.runtime_says.recompute_modules == ()


def _round_trip(plan, profile, cluster, tmp_path: Path, flag: str, *, dp: int) -> dict | None:
    """Export a NeMo plan to Megatron-LM, check it writes `flag` and reads back as NeMo's
    runtime as the plan has it; megatron-core's own configs built from it (None without
    megatron-core)."""
    out = export_plan(plan, Target.MEGATRON, Costing(profile, cluster, plan)).text
    assert flag in out
    world = cluster.num_gpus
    back = read(out, world_size=world, source="nemo.args")
    assert back.runtime == Framework.NEMO and back.runtime_says is not None
    assert back.runtime_says.apply(RUNTIMES[Framework.NEMO]) == plan.train.runtime
    if importlib.util.find_spec("megatron") is None:
        return None
    path = tmp_path / "nemo.args"
    path.write_text(out)
    return run_loaders("megatron", [{"path": str(path), "world_size": world, "dp": dp}])[0]


def test_gradient_dtype_and_fused_swiglu_flags(tmp_path: Path) -> None:
    """NeMo's recipes reduce gradients in bf16 (`grad_reduce_in_fp32=False`, Megatron-Bridge's
    perf recipes), Megatron-LM in fp32 unless `--grad-reduce-in-bf16`: a NeMo plan exports the
    flag (megatron-core's DDP config then reduces in bf16) and reads back as NeMo's runtime; a
    script with `--tp-comm-overlap` alone is NeMo's preset with fp32 gradients, 2 bytes per
    parameter more; `--no-bias-swiglu-fusion` keeps silu(gate) too (`act_glu_copy_bytes`)."""
    import paraplan

    cluster = parse_cluster("8xh100")
    model = "llama:layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=2048"
    profile = parse_model(model).to_profile(seq_len=2048)
    plan = paraplan.plan(
        model, "8xh100", global_batch=16, seq_len=2048, runtime="nemo", fix="tp=2,pp=1,mbs=1"
    ).plan
    assert not plan.train.runtime.fp32_grads
    view = _round_trip(plan, profile, cluster, tmp_path, "--grad-reduce-in-bf16", dp=4)
    assert view is None or view["grad_reduce_in_fp32"] is False

    base = (
        "--bf16 --seq-length 2048 --micro-batch-size 1 --global-batch-size 16 "
        "--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap "
    )
    found = {}
    for name, flags in (
        ("nemo", "--grad-reduce-in-bf16"),
        ("fp32", ""),
        ("eager", "--grad-reduce-in-bf16 --no-bias-swiglu-fusion"),
    ):
        setup = read(base + flags, world_size=8, source=f"{name}.args")
        assert setup.runtime == Framework.NEMO and setup.runtime_says is not None
        runtime = setup.runtime_says.apply(RUNTIMES[Framework.NEMO])
        assert (runtime == RUNTIMES[Framework.NEMO]) == (name == "nemo")
        train = TrainConfig(global_batch=16, seq_len=2048, runtime=runtime)
        found[name] = compare(name, setup, profile, cluster, train, top_k=0).yours.predicted
    grads = {k: v.memory_breakdown.grads_bytes for k, v in found.items()}
    params = profile.num_params / 2  # tp 2, dp 4 under ZeRO-1: gradients whole per TP shard
    assert grads["fp32"] - grads["nemo"] == pytest.approx(2 * params, rel=0.01)
    acts = {k: v.memory_breakdown.activations_bytes for k, v in found.items()}
    block = next(x for x in profile.layers if x.kind.value == "block")
    assert acts["eager"] - acts["nemo"] == pytest.approx(
        profile.num_blocks * block.act_glu_copy_bytes / 2, rel=1e-9
    )


def test_fp8_param_gather(tmp_path: Path) -> None:
    """Megatron-Bridge's fp8 recipes gather fp8 parameters (`fp8_param_gather = True`): a NeMo
    fp8 plan exports `--fp8-param-gather` (megatron-core's TransformerConfig then keeps fp8
    parameters, `fp8_param`, which it accepts only under fp8) and reads back as NeMo's runtime;
    priced, the distributed optimizer's parameter all-gather (exposed here) takes less time in
    fp8 than in bf16, and nothing changes under bf16 training."""
    import dataclasses

    import paraplan
    from paraplan.planner.config import Precision
    from paraplan.planner.cost.evaluate import Evaluator

    cluster = parse_cluster("16xh100")
    model = "llama:layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=2048"
    profile = parse_model(model).to_profile(seq_len=2048)
    fix = "dp=8,tp=2,pp=1,mbs=1,zero=1,recompute=none"
    plan = paraplan.plan(
        model, cluster, global_batch=16, seq_len=2048, runtime="nemo", precision="fp8", fix=fix
    ).plan
    assert plan.train.runtime.fp8_all_gather
    view = _round_trip(plan, profile, cluster, tmp_path, "--fp8-param-gather", dp=8)
    assert view is None or view["fp8_param"] is True
    exposed = dataclasses.replace(RUNTIMES[Framework.MEGATRON], param_gather_overlap=False)
    comm = {}
    for precision in (Precision.FP8, Precision.BF16):
        for fp8_gather in (False, True):
            runtime = dataclasses.replace(exposed, fp8_all_gather=fp8_gather)
            train = TrainConfig(global_batch=16, seq_len=2048, precision=precision, runtime=runtime)
            ev = Evaluator(profile, cluster, train)
            comm[(precision, fp8_gather)] = ev.evaluate(plan.strategy()).time.comm_s
    assert comm[(Precision.FP8, True)] < comm[(Precision.FP8, False)]
    assert comm[(Precision.BF16, True)] == comm[(Precision.BF16, False)]


def test_fp8_param_gather_without_fp8_is_refused() -> None:
    """Megatron-Core refuses fp8 parameters without fp8 training (`fp8_param must be used
    together with fp8 mode`): so does the reader, naming the flag and the fix."""
    with pytest.raises(ValueError, match="--fp8-param-gather needs fp8 training; add --fp8-format"):
        read("--bf16 --seq-length 2048 --fp8-param-gather", world_size=8, source="a.args")


def test_interleaved_pipeline_sends_overlap_unless_told_not_to() -> None:
    """Megatron-LM overlaps interleaved 1F1B's sends with compute unless
    `--no-overlap-p2p-communication` (`overlap_p2p_comm`; it batches 1F1B's and waits):
    with the flag the interleaved step is slower, by no more than its sends' whole time; 1F1B
    prices the same either way."""
    cluster = parse_cluster("32xh100")
    profile = parse_model("llama3-8b").to_profile(seq_len=4096)
    base = (
        "--bf16 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 "
        "--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 4 "
        "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
    )
    steps = {}
    for vp in ("--num-virtual-stages-per-pipeline-rank 2 ", ""):
        for name, flag in (("overlapped", ""), ("waited", "--no-overlap-p2p-communication")):
            setup = read(base + vp + flag, world_size=32, source=f"{name}.args")
            assert setup.runtime_says is not None
            runtime = setup.runtime_says.apply(RUNTIMES[Framework.MEGATRON])
            assert runtime.pp_comm_overlap == (name == "overlapped")
            train = TrainConfig(global_batch=64, seq_len=4096, runtime=runtime)
            plan = compare(name, setup, profile, cluster, train, top_k=0).yours
            steps[(bool(vp), name)] = plan.predicted
    slower = steps[(True, "waited")].step_time_s - steps[(True, "overlapped")].step_time_s
    assert slower > 0
    assert slower <= steps[(True, "waited")].time_breakdown.comm_s
    assert steps[(False, "waited")].step_time_s == steps[(False, "overlapped")].step_time_s
