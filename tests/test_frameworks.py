"""Plans priced for another framework (`paraplan plan --runtime`, planner/frameworks.py): the
search restricted to what the framework runs equals brute force over the same space, its plans
export to that trainer with nothing approximated, and bad combinations are refused early."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import paraplan
from paraplan.cli import main
from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.judge import judged_runtime, read_config
from paraplan.export.megatron import read
from paraplan.planner.capabilities import plan_gaps
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Runtime, TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.frameworks import RUNTIMES, SPACES, Framework
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan_io import load_plan, save_plan
from paraplan.planner.search import Search
from paraplan.planner.search_blocks import rank_key
from paraplan.planner.search_brute import brute_force
from paraplan.planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from tests.export_cases import run_loaders

MODEL = "gpt:layers=8,hidden=1024,heads=16,vocab=32000,seq=2048"
TARGET = {
    Framework.MEGATRON: Target.MEGATRON,
    Framework.NEMO: Target.MEGATRON,
    Framework.TORCHTITAN: Target.TORCHTITAN,
}


def _evaluator(framework: Framework, gpus: str = "16xh100", batch: int = 32) -> Evaluator:
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    train = TrainConfig(global_batch=batch, seq_len=2048, runtime=RUNTIMES[framework])
    return Evaluator(profile, parse_cluster(gpus, gpus_per_node=8), train)


@pytest.mark.parametrize("framework", [Framework.MEGATRON, Framework.TORCHTITAN])
def test_search_for_a_framework_equals_brute_force_over_its_space(framework: Framework) -> None:
    ev = _evaluator(framework)
    space = SPACES[framework]
    every = brute_force(ev, space=space)
    found = Search(ev, space=space).run(top_k=3)
    assert found.best is not None and every
    assert found.best.strategy == every[0].strategy
    assert found.best.step_time_s == pytest.approx(every[0].step_time_s, rel=1e-12)
    assert [rank_key(e)[:2] for e in found.ranked] == [rank_key(e)[:2] for e in every[:4]]
    for e in every:  # the space as the framework's exporter states it
        s = e.strategy
        assert s.mesh_order == DEFAULT_MESH_ORDER
        assert s.recompute != Recompute.PER_LAYER
        assert s.zero_stage in space.zero_stages
        assert s.pp == 1 or s.schedule in space.schedules
        assert not (s.offload_activations or s.powersgd_rank or s.async_pipeline)


def test_the_unrestricted_search_finds_what_the_frameworks_cannot_run() -> None:
    """The case above exercises the restriction: over the same model and cluster, some of
    paraplan's any-engine space lies outside megatron's (zero-bubble schedules, other mesh
    orders or per-layer recompute)."""
    ev = _evaluator(Framework.PARAPLAN)
    space = SPACES[Framework.MEGATRON]
    outside = [
        s
        for s in Search(ev).valid()
        if s.schedule not in (Schedule.NONE, *space.schedules) or s.mesh_order != DEFAULT_MESH_ORDER
    ]
    assert outside


@pytest.mark.parametrize("framework", [Framework.MEGATRON, Framework.NEMO, Framework.TORCHTITAN])
def test_plans_for_a_framework_export_to_it_as_they_are(framework: Framework) -> None:
    """Every ranked plan for a framework is one its trainer runs: the export names no
    approximation, and it is priced for the framework's runtime (the plan says so; `paraplan
    run` refuses it first of all)."""
    outcome = paraplan.plan(
        MODEL, "16xh100", global_batch=32, seq_len=2048, runtime=framework.value, top_k=3
    )
    plan = outcome.plan
    assert plan.train.runtime == RUNTIMES[framework]
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    costing = Costing(profile, parse_cluster("16xh100"), plan)
    exported = export_plan(plan, TARGET[framework], costing)
    assert exported.approximation is None, exported.approximation
    assert "priced for" in plan_gaps(plan)[0] and framework.value in plan_gaps(plan)[0]
    assert all(e.strategy.mesh_order == DEFAULT_MESH_ORDER for e in outcome.result.ranked)


def test_megatron_prices_the_runtime_it_runs() -> None:
    """Under sequence parallelism Megatron keeps the sequence shards for backward where torch's
    SequenceParallel (paraplan's executor) keeps the gathered inputs: less memory for the same
    strategy; and its fused kernels make the step no slower."""
    s = next(
        e.strategy
        for e in brute_force(_evaluator(Framework.MEGATRON), space=SPACES[Framework.MEGATRON])
        if e.strategy.sequence_parallel
    )
    ours = _evaluator(Framework.PARAPLAN).evaluate(s)
    megatron = _evaluator(Framework.MEGATRON).evaluate(s)
    assert megatron.memory.activations_bytes < ours.memory.activations_bytes
    assert megatron.step_time_s <= ours.step_time_s


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--runtime", "megatron", "--fix", "schedule=zbv"], "schedule=zbv"),
        (["--runtime", "torchtitan", "--fix", "zero=1"], "zero=1"),
        (["--runtime", "nemo", "--fix", "recompute=per_layer"], "recompute=per_layer"),
        (["--runtime", "megatron", "--allow-compression"], "--allow-compression"),
        (["--runtime", "megatron", "--fix", "offload_params=true,zero=3"], "offload_params"),
    ],
)
def test_what_a_framework_cannot_run_is_refused_before_tracing(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "--model", "llama3-8b", "--cluster", "8xh100", "--global-batch", "8"]
    code = main([*base, *argv])
    err = capsys.readouterr().err
    assert code == 2 and named in err and "--runtime" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_version_6_plan_reads_as_priced_for_the_executor(tmp_path: Path) -> None:
    """Plans written before the head width and the runtime were recorded (schema 6) load:
    heads as wide as hidden / heads, priced for paraplan's executor."""
    plan = paraplan.plan(MODEL, "8xh100", global_batch=8, seq_len=2048).plan
    path = tmp_path / "p.json"
    save_plan(plan, path)
    doc = json.loads(path.read_text())
    doc["schema_version"] = 6
    del doc["model"]["head_dim"], doc["train"]["runtime"]
    for par in [doc["parallelism"], *(r["parallelism"] for r in doc["runners_up"])]:
        del par["expert_tp"]  # schema 8
    path.write_text(json.dumps(doc))
    old = load_plan(path)
    assert old.model.head_dim == 0 and old.train.runtime == Runtime()
    assert old == plan


def test_tp_overlap_hides_only_a_tp_group_within_a_node() -> None:
    """NeMo's runtime is Megatron's with TP communication overlapped (userbuffers, over NVLink
    within a node) and its recipes' bf16 gradients: the same step is faster with tp=8 on 8-GPU
    nodes than Megatron's with bf16 gradients, and exactly as slow with tp=16, whose group
    spans two nodes."""
    megatron_ev = _evaluator(Framework.MEGATRON)
    runtime = dataclasses.replace(megatron_ev.train.runtime, fp32_grads=False)
    megatron_ev = Evaluator(
        megatron_ev.profile,
        megatron_ev.cluster,
        dataclasses.replace(megatron_ev.train, runtime=runtime),
    )
    for tp, faster in ((8, True), (16, False)):
        s = Strategy(dp=16 // tp, tp=tp, pp=1, micro_batch_size=1, sequence_parallel=True)
        nemo = _evaluator(Framework.NEMO).evaluate(s).step_time_s
        megatron = megatron_ev.evaluate(s).step_time_s
        assert (nemo < megatron) == faster
        if not faster:
            assert nemo == pytest.approx(megatron, rel=1e-12)


def test_a_megatron_config_is_judged_as_megatron_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --from-config ARGS --runtime megatron`: your configuration priced on Megatron's
    runtime as it is, against the best plan Megatron runs (1F1B or interleaved 1F1B)."""
    args = tmp_path / "megatron.args"
    args.write_text(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--micro-batch-size 1 --global-batch-size 32 --seq-length 2048 --num-layers 8 --bf16 "
        "--use-distributed-optimizer"
    )
    base = ["plan", "--from-config", str(args), "--model", MODEL, "--cluster", "16xh100"]
    assert main([*base, "--runtime", "megatron", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "priced for megatron's runtime" in out
    best = next(line for line in out.splitlines() if line.strip().startswith("strategy"))
    assert not any(name in best for name in ("zbv", "dualpipev", "interleaved_zb", "gpipe"))
    assert "dp_shard" not in out  # no HSDP on either side: the shard group is just dp
    assert main([*base, "--runtime", "paraplan", "--no-progress"]) == 0  # the executor's
    assert "priced for" not in capsys.readouterr().out
    assert main([*base, "--no-progress"]) == 0  # no --runtime: the trainer's own, Megatron's
    assert "priced for megatron's runtime" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("framework", "fix"),
    [
        (Framework.NEMO, "tp=2,pp=2,sp=true,mbs=1"),
        (Framework.MEGATRON, "tp=2,pp=2,sp=true,mbs=1"),
        (Framework.TORCHTITAN_COMPILE, "tp=2,zero=3,mbs=2"),
        (Framework.TORCHTITAN_ASYNC_TP, "tp=2,zero=3,mbs=2"),
        (Framework.TORCHTITAN, "tp=2,zero=3,mbs=2"),
    ],
)
def test_a_trainer_config_is_judged_on_the_runtime_it_states(
    framework: Framework, fix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan priced for a trainer's runtime, exported, and judged with no --runtime: the judge
    reads the runtime off the configuration (Megatron-LM's `--tp-comm-overlap`: NeMo's;
    torchtitan's `[compile] enable`: compiled) and prices your configuration at the plan's own
    step time; on a CPU cluster, where the trainers do not run, it is the executor's."""
    plan = paraplan.plan(
        MODEL, "16xh100", global_batch=32, seq_len=2048, runtime=framework.value, fix=fix
    ).plan
    target = Target.TORCHTITAN if "torchtitan" in framework.value else Target.MEGATRON
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    text = export_plan(plan, target, Costing(profile, parse_cluster("16xh100"), plan)).text
    config = tmp_path / ("mine.toml" if target == Target.TORCHTITAN else "mine.args")
    config.write_text(text)
    argv = ["plan", "--from-config", str(config), "--model", MODEL, "--no-progress"]
    assert main([*argv, "--cluster", "16xh100"]) == 0
    out = capsys.readouterr().out
    assert f"priced for {framework.value}'s runtime" in out
    assert f"{plan.predicted.step_time_s:.3f} s" in out
    setup = read_config(str(config), world_size=16)
    assert judged_runtime(None, setup, parse_cluster("16xcpu")) == Framework.PARAPLAN
    assert judged_runtime("paraplan", setup, parse_cluster("16xh100")) == Framework.PARAPLAN


def test_a_nemo_plan_exports_the_tp_overlap_it_was_priced_with(tmp_path: Path) -> None:
    """A plan priced with TP communication overlap (`--runtime nemo`) asks Megatron-LM for it
    (`--tp-comm-overlap`, a megatron-core `ModelParallelConfig` field, with sequence
    parallelism as it requires); megatron-core's own configs accept the file. Planned for
    Megatron's runtime (no overlap), the flag is absent."""
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    manifest = []
    for framework in (Framework.NEMO, Framework.MEGATRON):
        plan = paraplan.plan(
            MODEL,
            "8xh100",
            global_batch=16,
            seq_len=2048,
            runtime=framework.value,
            fix="tp=2,sp=true",
        ).plan
        text = export_plan(
            plan, Target.MEGATRON, Costing(profile, parse_cluster("8xh100"), plan)
        ).text
        assert ("--tp-comm-overlap" in text) == (framework == Framework.NEMO)
        path = tmp_path / f"{framework}.args"
        path.write_text(text)
        manifest.append({"path": str(path), "world_size": 8})
    verdicts = run_loaders("megatron", manifest)
    assert [v["tp_comm_overlap"] for v in verdicts] == [True, False]
    assert all(v["sp"] and v["tp"] == 2 for v in verdicts)


def test_a_compiled_torchtitan_plan_exports_compile_on(tmp_path: Path) -> None:
    """Priced compiled (`--runtime torchtitan-compile`), the torchtitan export turns
    torch.compile on (`[compile] enable`), which torchtitan's own ConfigManager reads; priced
    with Async TP (`--runtime torchtitan-async-tp`, tp 2) it turns that on as well (torchtitan
    0.3 refuses Async TP without compile: its ConfigManager accepts the file); priced eager
    (`--runtime torchtitan`), it leaves both off."""
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    manifest = []
    frameworks = (Framework.TORCHTITAN_COMPILE, Framework.TORCHTITAN_ASYNC_TP, Framework.TORCHTITAN)
    for framework in frameworks:
        plan = paraplan.plan(
            MODEL, "8xh100", global_batch=16, seq_len=2048, runtime=framework.value, fix="tp=2"
        ).plan
        costing = Costing(profile, parse_cluster("8xh100"), plan)
        text = export_plan(plan, Target.TORCHTITAN, costing).text
        path = tmp_path / f"{framework}.toml"
        path.write_text(text)
        manifest.append({"path": str(path), "world_size": 8, "dp": plan.parallelism.dp})
    views = run_loaders("torchtitan", manifest)
    assert [(v["compile"], v["async_tp"]) for v in views] == [
        (True, False),
        (True, True),
        (False, False),
    ]


def test_async_tp_hides_the_tp_collectives_compile_alone_does_not() -> None:
    """torchtitan's Async TP prices a TP plan's collectives hidden (within a node), so it is
    faster than compiled torchtitan, and equal to it without TP."""
    for fix, faster in (("tp=2,sp=true,mbs=1", True), ("tp=1,mbs=1", False)):
        step = {
            f: paraplan.plan(
                MODEL, "8xh100", global_batch=16, runtime=f.value, fix=fix
            ).plan.predicted.step_time_s
            for f in (Framework.TORCHTITAN_COMPILE, Framework.TORCHTITAN_ASYNC_TP)
        }
        gain = step[Framework.TORCHTITAN_COMPILE] - step[Framework.TORCHTITAN_ASYNC_TP]
        assert (gain > 0) == faster and gain >= 0


def test_an_uneven_pipeline_split_exports_as_megatron_s_layout(tmp_path: Path) -> None:
    """8 blocks over pp=2 x 3 chunks do not split evenly: the Megatron export writes the plan's
    chunks as `--pipeline-model-parallel-layout` (E, t, L per chunk), which megatron-core's own
    config parses into the same 3 virtual stages, and the reader reads back; an even split
    writes none (Megatron's default)."""
    profile = parse_model(MODEL).to_profile(2048, act_bytes=2)
    texts = {}
    for vpp in (3, 2):
        fix = f"pp=2,vpp={vpp},schedule=interleaved_1f1b,tp=1,cp=1"
        plan = paraplan.plan(
            MODEL, "16xh100", global_batch=32, seq_len=2048, runtime="megatron", fix=fix
        ).plan
        costing = Costing(profile, parse_cluster("16xh100"), plan)
        exported = export_plan(plan, Target.MEGATRON, costing)
        assert exported.approximation is None
        texts[vpp] = exported.text
    layout = next(x for x in texts[3].splitlines() if "pipeline-model-parallel-layout" in x)
    chunks = layout.split()[1].split("|")
    assert len(chunks) == 6 and chunks[0].startswith("E") and chunks[-1].endswith("L")
    assert sum(c.count("t") for c in chunks) == 8
    assert "pipeline-model-parallel-layout" not in texts[2]
    path = tmp_path / "uneven.args"
    path.write_text(texts[3])
    (view,) = run_loaders("megatron", [{"path": str(path), "world_size": 16}])
    assert view["vpp"] == 3 and view["pp"] == 2
    assert read(texts[3], world_size=16, source="x").strategy.virtual_stages == 3


def test_a_gpu_trainer_is_not_planned_on_cpus(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "8"]
    assert main([*argv, "--runtime", "torchtitan", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--runtime torchtitan" in err and "CPUs" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="trains on GPUs"):
        paraplan.plan(MODEL, "2xcpu", global_batch=8, runtime="megatron")


def test_compare_prices_every_row_for_the_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`paraplan compare --runtime megatron`: every compared plan carries megatron's runtime,
    the plan row is `paraplan plan --runtime megatron`'s own (same strategy, same step time)
    and within what Megatron runs, the report says so; a GPU trainer on CPUs is refused
    before any tracing (exit 2, one line)."""
    base = ["--model", MODEL, "--cluster", "16xh100", "--global-batch", "32", "--no-progress"]
    out = tmp_path / "report"
    argv = ["compare", *base, "--runtime", "megatron", "--tradeoff", "none", "-o", str(out)]
    assert main(argv) == 0
    assert "priced for megatron's runtime" in capsys.readouterr().out
    plans = {f.stem: load_plan(f) for f in (out / "plans").glob("*.json")}
    assert {"plan", "fsdp", "megatron", "dp-recompute"} <= set(plans)
    assert {p.train.runtime for p in plans.values()} == {RUNTIMES[Framework.MEGATRON]}
    alone = paraplan.plan(MODEL, "16xh100", global_batch=32, runtime="megatron").plan
    assert plans["plan"].strategy() == alone.strategy()
    assert plans["plan"].predicted.step_time_s == alone.predicted.step_time_s
    runs = SPACES[Framework.MEGATRON]
    for name in ("plan", *(n for n in plans if n.startswith("runner-up"))):
        s = plans[name].strategy()
        assert s.schedule in runs.schedules or s.pp == 1, name
        assert s.zero_stage in runs.zero_stages and s.recompute != Recompute.PER_LAYER, name
    assert "priced for megatron's runtime" in (out / "README.md").read_text()
    cpu = ["compare", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "8"]
    assert main([*cpu, "--runtime", "torchtitan", "-o", str(tmp_path / "cpu")]) == 2
    err = capsys.readouterr().err
    assert "--runtime torchtitan" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cpu").exists()
