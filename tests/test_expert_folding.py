"""Experts folded over TP (`Strategy.expert_tp` 1: Megatron-Core's MoE parallel folding,
torchtitan's EP borrowing the TP ranks): the search within each framework's space equals
brute force, a folded rank holds the experts its share says and runs one TP pair and the
all-to-alls per MoE block, the plan and its exports carry the choice through the trainers'
own loaders, and the experts' all-to-all overlap hides what it can."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import paraplan
from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.megatron import read as read_megatron
from paraplan.export.torchtitan import nearest as torchtitan_nearest
from paraplan.export.torchtitan import read_toml
from paraplan.planner.api import make_plan
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.comm import Links, links_for
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.frameworks import RUNTIMES, SPACES, Framework, framework_of
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.plan_io import load_plan, plan_from_dict, save_plan
from paraplan.planner.search import Search
from paraplan.planner.search_brute import brute_force
from paraplan.planner.strategy import DEFAULT_MESH_ORDER, MeshAxis, Strategy
from tests.export_cases import run_loaders

MOE = "moe:layers=4,hidden=1024,heads=8,kv_heads=2,vocab=32000,seq=2048,experts=8,top_k=2"


def _evaluator(framework: Framework, gpus: str = "16xh100", batch: int = 32) -> Evaluator:
    profile = parse_model(MOE).to_profile(2048, act_bytes=2)
    train = TrainConfig(global_batch=batch, seq_len=2048, runtime=RUNTIMES[framework])
    return Evaluator(profile, parse_cluster(gpus, gpus_per_node=8), train)


@pytest.mark.parametrize("framework", [Framework.MEGATRON, Framework.TORCHTITAN])
def test_search_with_folded_experts_equals_brute_force(framework: Framework) -> None:
    """Within Megatron's space (experts split over TP or folded) and torchtitan's (folded
    only, beside TP), the search's best is brute force's; both kinds are in Megatron's space,
    and an ep over dp (ep 8 > dp 4) exists only folded."""
    ev, space = _evaluator(framework), SPACES[framework]
    for fix in ("tp=2,pp=1", "tp=4,ep=8"):
        pins = Pins.parse(fix)
        every = brute_force(ev, pins, space=space)
        best = Search(ev, pins, space=space).run(top_k=3).best
        assert best is not None and every
        assert best.strategy == every[0].strategy
        assert best.step_time_s == pytest.approx(every[0].step_time_s, rel=1e-12)
        kinds = {e.strategy.folded_experts for e in every if e.strategy.ep > 1}
        assert kinds == (
            {True} if framework == Framework.TORCHTITAN or "ep=8" in fix else {True, False}
        )
        for e in every:
            s = e.strategy
            if s.folded_experts:
                assert s.sequence_parallel and s.ep % s.tp == 0 and s.dp % (s.ep // s.tp) == 0
            if framework == Framework.TORCHTITAN and s.ep_dp > 1:  # EP within dp_shard x cp
                assert s.zero_stage >= 2 and (s.shard_dp * s.cp) % s.ep_dp == 0


def _moe_sums(ev: Evaluator) -> tuple[float, float, int]:
    """Dense and expert parameters of the profile's layers, and its MoE blocks."""
    layers = ev.profile.layers
    dense = sum(x.params for x in layers)
    experts = sum(x.expert_params for x in layers)
    moe = sum(1 for x in layers if x.kind == LayerKind.BLOCK and x.expert_params)
    return dense, experts, moe


def test_a_folded_rank_holds_its_share_of_the_experts() -> None:
    """Parameters per GPU under ZeRO 0, counted from the profile's layers: the dense ones over
    tp, the experts over ep when folded (each expert whole) and over tp x ep when split."""
    ev = _evaluator(Framework.MEGATRON)
    dense, experts, _ = _moe_sums(ev)
    assert experts > dense  # a MoE model: the experts dominate what a rank holds
    for s, expert_share in (
        (Strategy(dp=8, tp=2, pp=1, ep=4, expert_tp=1, sequence_parallel=True), 4),
        (Strategy(dp=8, tp=2, pp=1, ep=4, sequence_parallel=True), 8),
        (Strategy(dp=8, tp=2, pp=1, ep=8, expert_tp=1, sequence_parallel=True), 8),
    ):
        held = ev.evaluate(s).memory.params_bytes
        assert held == pytest.approx((dense / 2 + experts / expert_share) * 2, rel=1e-9), s


def test_a_folded_moe_block_trades_its_mlp_tp_pair_for_all_to_alls() -> None:
    """On one 8-GPU node, tp 2: experts whole on each rank of a TP pair (ep 2 folded) against
    experts split over the pair (ep 1). Each rank holds the same experts, so memory is equal;
    per micro-batch the folded MoE block drops its MLP's all-gather + reduce-scatter forward
    and backward and runs its 4 all-to-alls (dispatch and combine, forward and backward) of
    the rank's own tokens x top_k within the pair."""
    ev = _evaluator(Framework.MEGATRON, gpus="8xh100", batch=8)
    split = Strategy(dp=4, tp=2, pp=1, micro_batch_size=2, sequence_parallel=True)
    folded = dataclasses.replace(split, ep=2, expert_tp=1)
    a, b = ev.evaluate(split), ev.evaluate(folded)
    assert a.memory.params_bytes == b.memory.params_bytes
    assert a.memory.optimizer_bytes == b.memory.optimizer_bytes
    _, _, moe = _moe_sums(ev)
    p, coll = ev.profile, ev.coll
    act = 2 * p.seq_len * p.hidden * 2  # a micro-batch's (b, s, h) bf16 activation
    pair_link = links_for(
        {MeshAxis.PP: 1, MeshAxis.DP: 4, MeshAxis.CP: 1, MeshAxis.TP: 2}, DEFAULT_MESH_ORDER, 1, 8
    ).tp
    assert pair_link == Links.ideal_of(2)
    pair = coll.all_gather(act, pair_link) + coll.reduce_scatter(act, pair_link)
    a2a = coll.all_to_all(act * p.top_k / 2, pair_link)
    (ta,), (tb,) = ev.stage_times(split), ev.stage_times(folded)
    assert tb.comm_s - ta.comm_s == pytest.approx(moe * (4 * a2a - 2 * pair), rel=1e-9)


def test_expert_overlap_hides_the_all_to_alls_under_the_other_micro_batch() -> None:
    """Megatron-Core's --overlap-moe-expert-parallel-comm: with two micro-batches or more the
    all-to-alls hide under compute (what is left shows, with the contention of what hid);
    with one there is nothing to pair with and the step is unchanged."""
    base = _evaluator(Framework.MEGATRON, gpus="8xh100", batch=8)
    runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], ep_comm_overlap=True)
    over = Evaluator(base.profile, base.cluster, dataclasses.replace(base.train, runtime=runtime))
    for mbs, faster in ((1, True), (2, False)):  # 2 or 1 micro-batches per replica
        s = Strategy(
            dp=4, tp=2, pp=1, ep=2, expert_tp=1, sequence_parallel=True, micro_batch_size=mbs
        )
        plain, hidden = base.evaluate(s).step_time_s, over.evaluate(s).step_time_s
        if faster:
            assert hidden < plain
        else:
            assert hidden == plain


def test_a_folded_plan_round_trips_through_json_and_the_trainers(tmp_path: Path) -> None:
    """Planned for Megatron with ep over dp (only folded runs it): the plan records
    expert_tp 1 and reads back equal; the Megatron export asks for
    --expert-tensor-parallel-size 1, which megatron-core's TransformerConfig takes, and reads
    back as the same strategy; torchtitan's export writes the folded ep, which its
    ConfigManager loads."""
    outcome = paraplan.plan(
        MOE,
        "16xh100",
        global_batch=32,
        seq_len=2048,
        runtime="megatron",
        fix="tp=4,ep=8,pp=1,zero=3",
    )
    plan = outcome.plan
    assert plan.parallelism.expert_tp == 1 and plan.strategy().folded_experts
    path = tmp_path / "p.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    profile = parse_model(MOE).to_profile(2048, act_bytes=2)
    costing = Costing(profile, parse_cluster("16xh100"), plan)
    text = export_plan(plan, Target.MEGATRON, costing).text
    assert "--expert-tensor-parallel-size 1" in text
    args = tmp_path / "m.args"
    args.write_text(text)
    (view,) = run_loaders("megatron", [{"path": str(args), "world_size": 16}])
    assert (view["tp"], view["ep"], view["etp"]) == (4, 8, 1)
    assert view["dispatcher"] == "alltoall"  # what is priced (Megatron-LM's default: allgather)
    assert view["ep_overlap"] == [False, False]  # Megatron's runtime does not overlap them
    # the model as planned: each expert's MLP, and 2 experts per token (Megatron's default)
    assert (view["ffn"], view["top_k"]) == (plan.model.ffn, plan.model.top_k) == (4096, 2)
    back = read_megatron(text, world_size=16, source="m.args")
    assert (back.strategy.ep, back.strategy.expert_tp, back.strategy.tp) == (8, 1, 4)
    assert not back.notes
    # Megatron-LM's default dispatcher all-gathers tokens: read as the all-to-all priced, noted
    default = text.replace("--moe-token-dispatcher-type alltoall", "")
    notes = read_megatron(default, world_size=16, source="m.args").notes
    assert any("allgather token dispatcher" in n for n in notes)
    titan = export_plan(plan, Target.TORCHTITAN, costing)
    assert "expert_parallel_degree = 8" in titan.text and titan.approximation is None
    toml = tmp_path / "t.toml"
    toml.write_text(titan.text)
    run_loaders("torchtitan", [{"path": str(toml), "world_size": 16, "dp": plan.parallelism.dp}])
    back = read_toml(titan.text, world_size=16, source="t.toml").strategy
    assert (back.ep, back.expert_tp, back.tp) == (8, 1, 4)


def test_torchtitan_folds_experts_split_over_tp_and_shards_them() -> None:
    """torchtitan never splits experts over TP, and its EP borrows FSDP's dp_shard ranks: the
    nearest it runs to experts split over TP beside DDP folds ep x tp (each rank's share of
    the experts kept) under ZeRO-2."""
    plan = paraplan.plan(
        MOE,
        "16xh100",
        global_batch=32,
        seq_len=2048,
        runtime="megatron",
        fix="tp=2,ep=2,etp=2,zero=0",
    ).plan
    s = plan.strategy()
    assert s.ep == 2 and not s.folded_experts and s.zero_stage == 0
    near, gaps = torchtitan_nearest(plan, s)
    assert (near.ep, near.expert_tp, near.zero_stage) == (4, 1, 2)
    assert any("experts split over TP" in g.feature for g in gaps)
    assert any("replicated data parallelism" in g.feature for g in gaps)


def test_a_version_7_plan_reads_with_its_experts_split_over_tp(tmp_path: Path) -> None:
    """Plans written before schema 8 recorded neither the experts' TP degree nor the
    all-to-all overlap: they load as experts split over TP (expert_tp = tp, in the runners-up
    too) and no overlap, equal to the plan they were."""
    plan = paraplan.plan(MOE, "16xh100", global_batch=32, seq_len=2048, fix="tp=1").plan
    path = tmp_path / "p.json"
    save_plan(plan, path)
    doc = json.loads(path.read_text())
    doc["schema_version"] = 7
    for par in [doc["parallelism"], *(r["parallelism"] for r in doc["runners_up"])]:
        del par["expert_tp"]
    del doc["train"]["runtime"]["ep_comm_overlap"]
    path.write_text(json.dumps(doc))
    assert load_plan(path) == plan


def test_a_nemo_moe_plan_exports_the_all_to_all_overlap_it_was_priced_with(
    tmp_path: Path,
) -> None:
    """NeMo's runtime overlaps the experts' all-to-alls where Megatron-Core can (expert
    parallelism, two micro-batches or more, no pipeline or an interleaved one, no full
    recompute, bf16): such a plan asks for --overlap-moe-expert-parallel-comm and
    --delay-wgrad-compute, which megatron-core's TransformerConfig accepts (its checks run),
    and reads back as NeMo's; one micro-batch per step has nothing to pair, so no flags, and
    the step is priced as Megatron's."""
    profile = parse_model(MOE).to_profile(2048, act_bytes=2)
    manifest, plans = [], []
    for batch in (64, 32):  # 2 and 1 micro-batches of 2 per replica (dp 16)
        fix = "tp=1,pp=1,ep=8,mbs=2,zero=2,recompute=none"
        plan = paraplan.plan(
            MOE, "16xh100", global_batch=batch, seq_len=2048, runtime="nemo", fix=fix
        ).plan
        # Megatron's runtime with NeMo's gradients in bf16 (its recipes' grad_reduce_in_fp32)
        runtime = dataclasses.replace(RUNTIMES[Framework.MEGATRON], fp32_grads=False)
        train = TrainConfig(global_batch=batch, seq_len=2048, runtime=runtime)
        cluster = parse_cluster("16xh100")
        megatron = make_plan(profile, cluster, train, pins=Pins.parse(fix)).plan
        plans.append((plan, megatron))
        text = export_plan(plan, Target.MEGATRON, Costing(profile, parse_cluster("16xh100"), plan))
        path = tmp_path / f"b{batch}.args"
        path.write_text(text.text)
        manifest.append({"path": str(path), "world_size": 16})
        back = read_megatron(text.text, world_size=16, source=path.name)
        assert back.runtime == (Framework.NEMO if batch == 64 else Framework.MEGATRON)
    views = run_loaders("megatron", manifest)
    assert [v["ep_overlap"] for v in views] == [[True, True], [False, False]]
    (overlapped, plain), (single, single_plain) = plans
    assert overlapped.predicted.step_time_s < plain.predicted.step_time_s
    assert single.predicted.step_time_s == single_plain.predicted.step_time_s


def test_a_version_7_nemo_plan_stays_nemo_s() -> None:
    """A version-7 plan priced for NeMo recorded its runtime without the all-to-all overlap,
    which NeMo's preset gained with schema 8: it reads back as NeMo's."""
    plan = paraplan.plan(MOE, "16xh100", global_batch=32, seq_len=2048, runtime="nemo").plan
    doc = json.loads(json.dumps(plan.to_dict()))
    doc["schema_version"] = 7
    for par in [doc["parallelism"], *(r["parallelism"] for r in doc["runners_up"])]:
        del par["expert_tp"]
    del doc["train"]["runtime"]["ep_comm_overlap"]
    for key in ("recompute_modules", "grad_reduce_overlap", "param_gather_overlap"):
        del doc["train"]["runtime"][key]  # schema 9's
    for key in ("norm_keeps_input_only", "glu_keeps_input_only"):
        del doc["train"]["runtime"][key]  # schema 10's
    doc["train"]["runtime"]["fp32_grads"] = True  # NeMo's preset before schema 10
    back = plan_from_dict(doc).train.runtime
    assert back == dataclasses.replace(RUNTIMES[Framework.NEMO], fp32_grads=True)
    assert framework_of(back) == Framework.NEMO


def test_megatron_export_routes_as_planned(tmp_path: Path) -> None:
    """A model routing each token to 4 experts: the export says so (Megatron-Core routes to 2
    unless told), megatron-core's config reads it, and the reader checks it against the model
    (a configuration routing to 2 describes another model)."""
    moe4 = MOE.replace("top_k=2", "top_k=4")
    plan = paraplan.plan(moe4, "16xh100", global_batch=32, seq_len=2048, runtime="megatron").plan
    profile = parse_model(moe4).to_profile(2048, act_bytes=2)
    text = export_plan(plan, Target.MEGATRON, Costing(profile, parse_cluster("16xh100"), plan)).text
    assert "--moe-router-topk 4" in text and plan.model.top_k == 4
    args = tmp_path / "m.args"
    args.write_text(text)
    (view,) = run_loaders("megatron", [{"path": str(args), "world_size": 16}])
    assert view["top_k"] == 4
    back = read_megatron(text, world_size=16, source="m.args")
    assert back.model_says is not None and back.model_says.mismatch(profile) is None
    two = read_megatron(text.replace("--moe-router-topk 4", ""), world_size=16, source="m.args")
    assert two.model_says is not None
    assert "no --moe-router-topk gives experts per token 2" in str(two.model_says.mismatch(profile))
