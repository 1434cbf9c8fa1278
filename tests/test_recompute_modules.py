"""Megatron-Core's module recompute (`--recompute-modules`, `Runtime.recompute_modules`): the
bytes each module frees counted by hand from the model's sizes, the seconds it adds bounded by
the bytes it streams, and the module list carried from a Megatron configuration to the plan
and back."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.judge import compare
from paraplan.export.megatron import parse_args, read
from paraplan.export.setup import RuntimeSays
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import RecomputeModule, TrainConfig
from paraplan.planner.cost.compute import MEMORY_EFFICIENCY
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.frameworks import RUNTIMES, Framework, framework_of, is_own
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan_io import plan_from_dict
from paraplan.planner.strategy import Recompute, Strategy
from tests.export_cases import run_loaders

MOE = "moe:layers=4,hidden=1024,heads=8,kv_heads=2,vocab=32000,seq=2048,experts=8,top_k=2"
SEQ = 2048
CORE, NORM, ACT = RecomputeModule.CORE_ATTN, RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT


def _evaluate(modules: tuple[RecomputeModule, ...], tp: int = 1, sp: bool = False):
    profile = parse_model(MOE).to_profile(seq_len=SEQ)
    runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=modules)
    train = TrainConfig(global_batch=8, seq_len=SEQ, runtime=runtime)
    ev = Evaluator(profile, parse_cluster("8xh100"), train)
    s = Strategy(
        dp=8 // tp, tp=tp, pp=1, sequence_parallel=sp, micro_batch_size=1,
        recompute=Recompute.SELECTIVE,
    )  # fmt: skip
    return profile, ev.evaluate(s)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, True)])
def test_module_bytes_counted_by_hand(tp: int, sp: bool) -> None:
    """4 MoE blocks, one micro-batch of 2048 tokens in bf16: recomputing the norms frees their
    two outputs (h elements per token each, a sequence shard under SP), recomputing the experts'
    activation frees its output for each of the top-2 routed copies (ffn / tp elements)."""
    profile, core = _evaluate((CORE,), tp, sp)
    _, norms = _evaluate((CORE, NORM), tp, sp)
    _, both = _evaluate((CORE, NORM, ACT), tp, sp)
    _, neither = _evaluate((), tp, sp)
    h, ffn, blocks = 1024, profile.ffn, 4
    norm_bytes = blocks * 2 * h * SEQ / (tp if sp else 1) * 2
    act_bytes = blocks * 2 * (ffn // tp) * SEQ * 2
    acts = lambda e: e.memory.activations_bytes  # noqa: E731
    assert acts(core) - acts(norms) == pytest.approx(norm_bytes, rel=1e-9)
    assert acts(norms) - acts(both) == pytest.approx(act_bytes, rel=1e-9)
    core_bytes = sum(x.act_attn_core_bytes for x in profile.layers) / tp
    assert acts(neither) - acts(core) == pytest.approx(core_bytes, rel=1e-9)


def test_module_seconds_are_memory_bound_streams() -> None:
    """What the norms and the activation add to the recompute is their streamed bytes at the
    memory-bound rate: each norm reads and writes h per token, SwiGLU reads its two ffn-wide
    halves and writes one, for each routed copy; nothing of the attention core is redone
    without core_attn."""
    profile, core = _evaluate((CORE,))
    _, both = _evaluate((CORE, NORM, ACT))
    _, nothing = _evaluate(())
    assert nothing.time.recompute_s == 0.0 < core.time.recompute_s < both.time.recompute_s
    h, ffn, blocks = 1024, profile.ffn, 4
    streamed = blocks * SEQ * (2 * 2 * h + 2 * 3 * ffn) * 2  # bf16
    bw = parse_cluster("8xh100").accelerator.memory_bw_bytes_per_s * MEMORY_EFFICIENCY
    assert both.time.recompute_s - core.time.recompute_s == pytest.approx(streamed / bw, rel=1e-6)


def test_megatron_modules_read_priced_and_written_back(tmp_path: Path) -> None:
    """`--recompute-modules moe_act layernorm` is read whole, priced on Megatron's runtime (your
    configuration keeps less than with the attention core alone) and written back by the
    export."""
    base = "--bf16 --seq-length 2048 --micro-batch-size 1 --global-batch-size 8 --moe-grouped-gemm "
    base += "--overlap-grad-reduce "
    text = base + "--recompute-granularity selective --recompute-modules moe_act layernorm"
    assert parse_args(text)["recompute-modules"] == "moe_act layernorm"
    setup = read(text, world_size=8, source="mine.args")
    assert (
        setup.runtime_says is not None
        and setup.runtime_says.recompute_modules == (ACT, NORM)
        and not setup.notes
    )
    with pytest.raises(ValueError, match="moe_act needs --moe-grouped-gemm"):
        read(text.replace("--moe-grouped-gemm ", ""), world_size=8, source="mine.args")
    profile = parse_model(MOE).to_profile(seq_len=SEQ)
    cluster = parse_cluster("8xh100")
    runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=(ACT, NORM))
    train = TrainConfig(global_batch=8, seq_len=SEQ, runtime=runtime)
    mine = compare("mine.args", setup, profile, cluster, train, top_k=0).yours
    default = dataclasses.replace(train, runtime=RUNTIMES[Framework.MEGATRON])
    plain = compare("core.args", setup, profile, cluster, default, top_k=0).yours
    assert mine.predicted.memory_per_gpu_bytes < plain.predicted.memory_per_gpu_bytes
    assert mine.train.runtime.recompute_modules == (ACT, NORM)
    out = export_plan(mine, Target.MEGATRON, Costing(profile, cluster, mine)).text
    again = read(out, world_size=8, source="exported.args")
    assert (
        again.runtime_says
        == RuntimeSays(
            recompute_modules=(ACT, NORM), grad_reduce_overlap=True, param_gather_overlap=True
        )
        and again.strategy == setup.strategy
    )
    if importlib.util.find_spec("megatron") is not None:  # megatron-core's TransformerConfig
        path = tmp_path / "exported.args"
        path.write_text(out)
        view = run_loaders("megatron", [{"path": str(path), "world_size": 8, "dp": 8}])[0]
        assert view["recompute_modules"] == ["moe_act", "layernorm"]
        assert view["recompute"] == ["selective", None]


def test_framework_and_old_plans() -> None:
    """Megatron's runtime with its own module list is still Megatron's (not the executor's);
    a version-8 plan, which had no list, reads back with the attention core alone."""
    runtime = dataclasses.replace(RUNTIMES[Framework.NEMO], recompute_modules=(NORM,))
    assert framework_of(runtime) == Framework.NEMO and not is_own(runtime)
    own = dataclasses.replace(RUNTIMES[Framework.PARAPLAN], recompute_modules=())
    assert framework_of(own) is None  # the executor recomputes the attention core only
    import paraplan

    plan = paraplan.plan(MOE, "8xh100", global_batch=8, seq_len=SEQ, runtime="megatron").plan
    doc = json.loads(json.dumps(plan.to_dict()))
    doc["schema_version"] = 8
    for key in ("recompute_modules", "grad_reduce_overlap", "param_gather_overlap"):
        del doc["train"]["runtime"][key]
    assert plan_from_dict(doc).train.runtime == RUNTIMES[Framework.MEGATRON]


def test_plan_takes_a_module_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`plan --runtime nemo --recompute-modules layernorm,moe_act`: the plan's runtime holds the
    list and its summary says what selective recompute redoes; a list for a runtime that does
    not take one, a name Megatron-Core does not know or one named twice is refused with exit 2
    in one line."""
    import paraplan
    from paraplan.cli import main
    from paraplan.planner.explain import format_plan

    plan = paraplan.plan(
        MOE, "8xh100", global_batch=64, seq_len=SEQ, runtime="nemo", fix="recompute=selective",
        recompute_modules="layernorm,moe_act",
    ).plan  # fmt: skip
    assert plan.train.runtime.recompute_modules == (NORM, ACT)
    assert "selective (redoes layernorm, moe_act)" in format_plan(plan)
    base = ["plan", "--model", MOE, "--cluster", "8xh100", "--global-batch", "64"]
    for extra, said in [
        (["--recompute-modules", "layernorm"], "only Megatron-Core's runtimes"),
        (["--runtime", "megatron", "--recompute-modules", "attention"], "give distinct modules"),
        (["--runtime", "megatron", "--recompute-modules", "moe,moe"], "give distinct modules"),
    ]:
        assert main([*base, *extra, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1
    compare = ["compare", *base[1:], "-o", str(tmp_path / "report"), "--no-progress"]
    assert main([*compare, "--recompute-modules", "layernorm"]) == 2  # compare takes it too
    assert "only Megatron-Core's runtimes" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()  # refused before any work


def test_auto_keeps_the_faster_module_list(capsys: pytest.CaptureFixture[str]) -> None:
    """`--recompute-modules auto` is the fastest of the plans each module list gives (brute
    force over the three a MoE model weighs, the whole MoE layer among them); `compare` does
    not take it (exit 2, one line)."""
    import paraplan
    from paraplan.cli import main

    moe = "moe:layers=16,hidden=2048,heads=16,kv_heads=4,vocab=32000,seq=4096,experts=64,top_k=8"
    kw = dict(global_batch=64, seq_len=4096, runtime="nemo", top_k=0)
    each = {
        lists: paraplan.plan(moe, "8xh100", recompute_modules=lists, **kw).plan  # type: ignore[arg-type]
        for lists in ("core_attn", "layernorm,moe_act", "layernorm,moe")
    }
    auto = paraplan.plan(moe, "8xh100", recompute_modules="auto", **kw).plan  # type: ignore[arg-type]
    best = min(each.values(), key=lambda p: p.predicted.step_time_s)
    assert auto.predicted.step_time_s == best.predicted.step_time_s
    assert auto.train.runtime.recompute_modules == best.train.runtime.recompute_modules
    argv = ["compare", "--model", moe, "--cluster", "8xh100", "--global-batch", "64"]
    argv += ["--runtime", "nemo", "--recompute-modules", "auto", "-o", "/nonexistent/x"]
    assert main([*argv, "--no-progress"]) == 2
    assert "only `paraplan plan` searches the module lists" in capsys.readouterr().err


def test_auto_weighs_the_whole_moe_layer_where_only_it_fits() -> None:
    """A MoE model whose pinned plan (no offload) fits on H200s only when recomputing whole MoE
    layers (Megatron's `moe`: ~20 GiB less than `layernorm,moe_act` here): `auto` finds it, as
    the brute force over the three lists does; a dense model's `auto` weighs the two lists
    alone (it has no MoE layer to recompute)."""
    import paraplan
    from paraplan.planner.api import NoFeasiblePlanError
    from paraplan.planner.config import RecomputeModule
    from paraplan.planner.frameworks import MODULE_CHOICES, Framework, module_choices

    moe = "moe:layers=18,hidden=2048,heads=16,kv_heads=4,vocab=32000,seq=4096,experts=64,top_k=8"
    fix = "dp=8,tp=1,pp=1,ep=8,zero=1,mbs=1,recompute=selective,offload=false"
    fix += ",offload_params=false,offload_acts=false"
    kw = dict(global_batch=64, seq_len=4096, runtime="nemo", top_k=0, fix=fix)
    for lists in ("core_attn", "layernorm,moe_act"):
        with pytest.raises(NoFeasiblePlanError):
            paraplan.plan(moe, "8xh200", recompute_modules=lists, **kw)  # type: ignore[arg-type]
    only = paraplan.plan(moe, "8xh200", recompute_modules="layernorm,moe", **kw).plan  # type: ignore[arg-type]
    auto = paraplan.plan(moe, "8xh200", recompute_modules="auto", **kw).plan  # type: ignore[arg-type]
    assert auto.feasible and auto.predicted.step_time_s == only.predicted.step_time_s
    assert auto.train.runtime.recompute_modules == (RecomputeModule.LAYERNORM, RecomputeModule.MOE)
    assert module_choices("auto", Framework.NEMO, allow_auto=True, moe=False) == MODULE_CHOICES


DENSE = "llama:layers=4,hidden=1024,heads=8,kv_heads=2,ffn=2816,vocab=32000,seq=2048"


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, True)])
def test_mlp_recompute_bytes_and_seconds(tp: int, sp: bool) -> None:
    """`mlp` on a dense SwiGLU model (4 blocks, one micro-batch of 2048 bf16 tokens): each
    block frees its MLP's normalized input (h per token, a shard under SP), the gate and up
    projections' output (2 f / tp) and the down projection's input (f / tp); it redoes the MLP's
    GEMMs, 3 x 2 h f / tp FLOPs per token, no faster than the GPU's dense bf16 peak and not
    ten times slower."""
    profile = parse_model(DENSE).to_profile(seq_len=SEQ)
    cluster = parse_cluster("8xh100")
    estimates = {}
    for modules in ((CORE,), (CORE, RecomputeModule.MLP)):
        runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=modules)
        train = TrainConfig(global_batch=8, seq_len=SEQ, runtime=runtime)
        s = Strategy(
            dp=8 // tp, tp=tp, pp=1, sequence_parallel=sp, micro_batch_size=1,
            recompute=Recompute.SELECTIVE,
        )  # fmt: skip
        estimates[modules] = Evaluator(profile, cluster, train).evaluate(s)
    core, mlp = estimates[(CORE,)], estimates[(CORE, RecomputeModule.MLP)]
    h, f, blocks = 1024, 2816, 4
    freed = blocks * SEQ * (h / (tp if sp else 1) + 3 * f / tp) * 2
    acts = lambda e: e.memory.activations_bytes  # noqa: E731
    assert acts(core) - acts(mlp) == pytest.approx(freed, rel=1e-9)
    flops = blocks * SEQ * 3 * 2 * h * f / tp
    peak = cluster.accelerator.peak_flops["bf16"]
    added = mlp.time.recompute_s - core.time.recompute_s
    assert flops / peak < added < 10 * flops / peak  # small GEMMs (tp 2) run far below peak


def test_mla_up_proj_frees_query_key_value(tmp_path: Path) -> None:
    """`mla_up_proj` on a traced DeepSeek-style model (latent attention: 4 heads, queries and
    keys 32 + 16 wide, values 32): each block frees the query, key and value its attention core
    keeps, 4 x (48 + 48 + 32) elements per token; a model without latent attention is refused,
    as Megatron-Core refuses it."""
    pytest.importorskip("transformers")
    import paraplan
    from profiler.hf import profile_hf
    from tests.test_ep_dispatch import GROUPED

    seq = 32  # the config's positions: 64
    profile = profile_hf({**GROUPED, "num_nextn_predict_layers": 0}, seq_len=seq)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, recompute=Recompute.SELECTIVE)
    acts = {}
    for modules in ((CORE,), (CORE, RecomputeModule.MLA_UP_PROJ)):
        runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], recompute_modules=modules)
        train = TrainConfig(global_batch=8, seq_len=seq, runtime=runtime)
        acts[modules] = Evaluator(profile, cluster, train).evaluate(s).memory.activations_bytes
    freed = profile.num_blocks * seq * 4 * (48 + 48 + 32) * 2
    assert acts[(CORE,)] - acts[(CORE, RecomputeModule.MLA_UP_PROJ)] == pytest.approx(freed)
    with pytest.raises(ValueError, match="no multi-head latent attention"):
        paraplan.plan(
            MOE, "8xh100", global_batch=8, seq_len=SEQ, runtime="megatron",
            recompute_modules="mla_up_proj",
        )  # fmt: skip
