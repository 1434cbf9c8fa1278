"""fp8 training (`Precision.FP8`, planner/cost/float8.py): the GEMMs of a block's linear layers
at the fp8 peak, the dynamic-scaling casts as memory traffic, early refusals, and the exports
that carry fp8 to torchtitan and Megatron-LM (read back by their own loaders)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

import paraplan
from paraplan.cli import main
from paraplan.export.exporter import Target, export_plan
from paraplan.export.megatron import read as read_megatron
from paraplan.export.torchtitan import read_toml
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Precision, Runtime, TrainConfig
from paraplan.planner.cost.compute import KERNELS, MEMORY_EFFICIENCY, KernelModel
from paraplan.planner.cost.data_parallel import gathered_bytes
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.float8 import float8_linears
from paraplan.planner.explain import explain
from paraplan.planner.hardware import get_accelerator
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.search_brute import brute_force
from paraplan.planner.strategy import Recompute, Strategy
from tests.export_cases import run_loaders
from tests.search_checks import assert_search_is_exact

H100 = get_accelerator("h100")


def test_fp8_gemms_run_at_twice_the_bf16_rate_on_hopper() -> None:
    """A large GEMM is compute-bound: fp8 halves it, as the H100 datasheet's dense peaks do
    (1,979 against 989 TFLOP/s, NVIDIA H100 datasheet)."""
    table = KERNELS["h100"]
    bf16, fp8 = KernelModel(H100, "bf16", table), KernelModel(H100, "fp8", table)
    assert H100.peak_flops_for("fp8") == pytest.approx(2 * H100.peak_flops_for("bf16"), rel=1e-3)
    for m, n, k in ((8192, 8192, 8192), (16384, 28672, 4096)):
        assert fp8.gemm_s(m, n, k) == pytest.approx(bf16.gemm_s(m, n, k) / 2, rel=1e-3)


def test_casts_add_the_bytes_dynamic_scaling_streams() -> None:
    """Compiled dynamic scaling, by hand: forward casts input (m k) and weight (k n) at 5 bytes
    an element (amax reads 2; the cast reads 2, writes 1); backward casts the output gradient
    (5) plus its second layout (3), and the weight and input again (5 each)."""
    train = TrainConfig(global_batch=8, seq_len=8192, precision="fp8")
    train = dataclasses.replace(train, runtime=Runtime(fused_elementwise=True))
    lin = float8_linears(parse_cluster("8xh100"), train, None)
    assert lin is not None
    m, n, k = 8192, 14336, 4096
    f, b = lin.gemm_train_s(lin.bf16, m, n, k)
    gf, gb = lin.fp8.gemm_train_s(m, n, k)
    bw = 3.35e12 * MEMORY_EFFICIENCY  # H100 SXM HBM3, datasheet
    assert H100.memory_bw_bytes_per_s == pytest.approx(3.35e12, rel=0.01)
    assert f - gf == pytest.approx((5 * m * k + 5 * k * n) / bw, rel=0.01)
    assert b - gb == pytest.approx((8 * m * n + 5 * k * n + 5 * m * k) / bw, rel=0.01)
    # fp8 runs compiled whatever the runtime's other kernels do: the same casts under eager
    eager = float8_linears(
        parse_cluster("8xh100"), TrainConfig(global_batch=8, seq_len=8192, precision="fp8"), None
    )
    assert eager is not None
    assert eager.gemm_train_s(eager.bf16, m, n, k) == pytest.approx((f, b))


def _step(precision: str, model: str, cluster: str, s: Strategy, batch: int) -> tuple[float, float]:
    spec = parse_model(model)
    train = TrainConfig(
        global_batch=batch,
        seq_len=8192,
        precision=precision,
        runtime=Runtime(fused_elementwise=True),  # compiled, as fp8 is run
    )
    ev = Evaluator(spec.to_profile(8192, act_bytes=2), parse_cluster(cluster), train)
    est = ev.evaluate(s)
    return est.step_time_s, est.memory.total_bytes


def test_fp8_speedup_within_what_nvidia_reports_and_memory_unchanged() -> None:
    """NVIDIA's Megatron-Bridge performance guide: fp8 on the blocks' linear layers "typically
    achiev[es] a speedup of 1.2-1.5X" over bf16, less for small models; the memory is bf16's
    (torchao and Transformer Engine keep bf16 weights and save bf16 activations)."""
    big = Strategy(
        dp=2,
        tp=8,
        pp=4,
        zero_stage=1,
        sequence_parallel=True,
        schedule="1f1b",
        micro_batch_size=1,
        recompute=Recompute.FULL,
    )
    t16, m16 = _step("bf16", "llama3-70b", "64xh100", big, 64)
    t8, m8 = _step("fp8", "llama3-70b", "64xh100", big, 64)
    assert 1.15 <= t16 / t8 <= 1.6
    assert m8 == pytest.approx(m16)
    # On one layout, the gain grows with the hidden size (linear layers' share of the step).
    one = Strategy(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1, recompute=Recompute.FULL)
    gains = []
    for model in ("llama3-8b", "llama3-70b", "llama3-405b"):
        b16, _ = _step("bf16", model, "8xh100", one, 16)
        b8, _ = _step("fp8", model, "8xh100", one, 16)
        gains.append(b16 / b8)
    assert 1.0 < gains[0] < gains[1] < gains[2] <= 1.6


@pytest.mark.parametrize(
    ("cluster", "extra", "words"),
    [
        ("8xa100-80gb", ["--any-engine"], ["fp8 tensor cores", "a100-80gb", "--precision bf16"]),
        ("2xcpu", ["--any-engine"], ["fp8 tensor cores", "cpu"]),
        ("8xh100", [], ["fp8", "executor", "--any-engine"]),
    ],
)
def test_fp8_refused_before_any_search(
    cluster: str, extra: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", "llama3-8b", "--cluster", cluster, "--global-batch", "16"]
    assert main([*argv, "--precision", "fp8", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_fp8_plan_exports_to_torchtitan_and_megatron_and_reads_back(tmp_path: Path) -> None:
    plan = paraplan.plan(
        "llama3-8b",
        "8xh100",
        global_batch=64,
        seq_len=8192,
        precision="fp8",
        model_source="spec",
        any_engine=True,
        fix="dp=4,tp=2,pp=1,zero=3,recompute=full,mbs=1",
        top_k=0,
    ).plan
    assert plan.train.precision == Precision.FP8
    peak = f"{plan.predicted.model_flops_per_s_per_gpu / plan.predicted.mfu / 1e12:.1f}"
    assert peak == "989.4"  # the H100's bf16 dense peak, not its fp8 one
    assert f"of the {peak} TFLOP/s bf16 peak per GPU" in explain(plan)
    megatron = export_plan(plan, Target.MEGATRON, None).text
    assert "--fp8-format hybrid" in megatron and "--bf16" in megatron
    assert read_megatron(megatron, world_size=8, source="m").precision == Precision.FP8
    (tmp_path / "m.args").write_text(megatron)
    titan = export_plan(plan, Target.TORCHTITAN, None).text
    assert read_toml(titan, world_size=8, source="t").precision == Precision.FP8
    (tmp_path / "t.toml").write_text(titan)
    (m,) = run_loaders("megatron", [{"path": str(tmp_path / "m.args"), "world_size": 8, "dp": 4}])
    (t,) = run_loaders("torchtitan", [{"path": str(tmp_path / "t.toml"), "world_size": 8, "dp": 4}])
    assert m["bf16"] and m["tp"] == 2 and t["param_dtype"] == "bfloat16" and t["tp"] == 2
    with pytest.raises(ValueError, match="deepspeed cannot express fp8"):
        export_plan(plan, Target.DEEPSPEED, None)


def test_compare_plans_fp8_for_any_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The executor does not train in fp8, so compare's own plan row is planned for any engine
    (as its framework baselines are) instead of coming out "not valid"."""
    argv = ["compare", "--model", "llama3-8b", "--model-source", "spec", "--cluster", "8xh100"]
    argv += ["--global-batch", "16", "--seq-len", "2048", "--precision", "fp8", "--top", "0"]
    assert main([*argv, "--no-progress", "-o", str(tmp_path / "out")]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("paraplan plan"))
    assert row.rstrip().endswith("fits"), row


def test_fsdp_fp8_all_gather_moves_one_byte_per_block_weight() -> None:
    """torchtitan's `enable_fsdp_float8_all_gather`: the blocks' weights travel in fp8, the
    embedding and head in bf16; the step's exposed FSDP traffic shrinks, nothing else moves."""
    profile = parse_model("llama3-8b").to_profile(8192, act_bytes=2)
    cluster = parse_cluster("32xh200")
    s = Strategy(dp=32, tp=1, pp=1, zero_stage=3, micro_batch_size=2, recompute=Recompute.FULL)
    base = TrainConfig(global_batch=64, seq_len=8192, precision="fp8")
    on = dataclasses.replace(base, runtime=Runtime(fp8_all_gather=True))
    blocks = sum(x.params for x in profile.layers if x.kind == LayerKind.BLOCK)
    total = sum(x.params for x in profile.layers)
    ev = Evaluator(profile, cluster, on)
    (stage,) = ev.stage_model.stages(ev.stage_model.layout_of(s))
    assert gathered_bytes(on, stage) == pytest.approx((blocks + 2 * (total - blocks)) / total)
    assert gathered_bytes(base, stage) == 2
    fast, slow = ev.evaluate(s), Evaluator(profile, cluster, base).evaluate(s)
    assert fast.time.comm_s < slow.time.comm_s and fast.time.compute_s == slow.time.compute_s


def test_fp8_search_is_exact_against_brute_force() -> None:
    """fp8's cheaper forward gathers under sequence parallelism enter the search's bounds too:
    the search still returns brute force's best, also with TP pinned."""
    ev = Evaluator(
        parse_model("gpt:layers=4,hidden=1024,heads=16,vocab=8192,seq=2048").to_profile(2048),
        parse_cluster("8xh100"),
        TrainConfig(global_batch=16, seq_len=2048, precision="fp8"),
    )
    assert_search_is_exact(ev, ("", "tp=4,sp=true"))


def test_fp8_gathers_the_sequence_parallel_inputs_in_one_byte() -> None:
    """Under TP with SP, fp8 leaves compute's other parts alone and lowers the exposed TP
    traffic: the forward all-gathers move half the bytes."""
    profile = parse_model("llama3-70b").to_profile(8192, act_bytes=2)
    cluster = parse_cluster("64xh100")
    s = Strategy(dp=8, tp=8, pp=1, zero_stage=1, sequence_parallel=True, micro_batch_size=1)
    comm = {}
    for precision in ("bf16", "fp8"):
        train = TrainConfig(global_batch=64, seq_len=8192, precision=precision)
        comm[precision] = Evaluator(profile, cluster, train).evaluate(s).time.comm_s
    assert comm["fp8"] < comm["bf16"]


@pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None
    or importlib.util.find_spec("torchao") is not None,
    reason="needs torchtitan without torchao (its Float8 layers then cannot be built)",
)
def test_torchtitan_float8_registry_config_without_torchao_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torchtitan's llama3_405b registry config applies Float8 linear layers, which torchao
    builds: without it the command says so (exit 2, one line), not a traceback."""
    argv = ["plan", "--from-config", "torchtitan:llama3.llama3_405b", "--model", "llama3-405b"]
    assert main([*argv, "--model-source", "spec", "--cluster", "512xh100", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "torchtitan:llama3.llama3_405b" in err[-1] and "pip install torchao" in err[-1]


def test_search_is_exact_with_tp_overlap() -> None:
    """With TP collectives hidden under compute (Megatron's --tp-comm-overlap, the NeMo and
    Megatron-LM README rows' runtime) the search's bounds leave them out, and the search
    returns brute force's best (fp8 and bf16)."""
    profile = parse_model("gpt:layers=4,hidden=1024,heads=16,vocab=8192,seq=2048").to_profile(2048)
    for precision in ("bf16", "fp8"):
        train = TrainConfig(
            global_batch=16,
            seq_len=2048,
            precision=precision,
            runtime=Runtime(fused_elementwise=True, tp_comm_overlap=True),
        )
        ev = Evaluator(profile, parse_cluster("8xh100"), train)
        pins = Pins.parse("tp=4,sp=true")
        best = Search(ev, pins).run(top_k=3).best
        everything = brute_force(ev, pins)
        assert best is not None and everything
        assert (best.strategy, best.step_time_s) == (
            everything[0].strategy,
            everything[0].step_time_s,
        )
