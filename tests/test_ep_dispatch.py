"""The experts' dispatch: how many other nodes a token's experts sit on (against enumerating
every routing), what a node-deduplicated dispatch costs against the all-to-all, and where the
setting travels (CLI, plan file, older plans and profiles)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from fractions import Fraction

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import EpDispatch
from paraplan.planner.cost.comm import AxisLink, Collectives
from paraplan.planner.cost.routing import Routing, remote_nodes
from paraplan.planner.plan_io import upgrade


def _enumerated(experts: int, top_k: int, nodes: int, groups: int, group_top_k: int) -> Fraction:
    """Expected other nodes a token reaches, by listing every equally likely routing: each
    `group_top_k` of the groups, then each `top_k` of their experts (every group when not
    limited), from each source node; experts lie in order, E/N to a node."""
    per_node, per_group = experts // nodes, experts // groups
    total, count = Fraction(0), 0
    for chosen in itertools.combinations(range(groups), group_top_k):
        pool = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        for picked in itertools.combinations(pool, top_k):
            hit = {e // per_node for e in picked}
            for source in range(nodes):
                total += len(hit - {source})
                count += 1
    return total / count


@pytest.mark.parametrize(
    ("experts", "top_k", "nodes", "groups", "group_top_k"),
    [
        (8, 2, 2, 1, 1),  # not limited, two nodes
        (8, 3, 4, 1, 1),  # not limited, four nodes
        (16, 4, 4, 4, 2),  # a group per node (DeepSeek-V3's layout on 8 nodes, smaller)
        (16, 3, 2, 8, 3),  # four groups on each node
        (16, 3, 8, 2, 1),  # each group across four nodes
        (12, 2, 3, 4, 2),  # groups straddling nodes
        (12, 4, 4, 3, 2),  # and the other way
    ],
)
def test_remote_nodes_match_enumeration(
    experts: int, top_k: int, nodes: int, groups: int, group_top_k: int
) -> None:
    routing = Routing(experts, top_k, EpDispatch.HIERARCHICAL, groups, group_top_k)
    exact = float(_enumerated(experts, top_k, nodes, groups, group_top_k))
    assert remote_nodes(routing, nodes) == pytest.approx(exact, rel=1e-12)


def test_group_limit_bounds_the_nodes_reached() -> None:
    """DeepSeek-V3 (256 experts, 8 per token, 8 groups of which 4) over 8 nodes: a token reaches
    at most 4 nodes (its report's node-limited routing, arXiv 2412.19437 §2.1.2), so at most
    4 other ones; without the limit it reaches more, and never more than 7."""
    limited = remote_nodes(Routing(256, 8, EpDispatch.HIERARCHICAL, 8, 4), 8)
    free = remote_nodes(Routing(256, 8, EpDispatch.HIERARCHICAL), 8)
    assert limited <= 4 * 7 / 8
    assert limited < free <= 7
    assert remote_nodes(Routing(256, 8, EpDispatch.HIERARCHICAL), 1) == 0.0


def test_hierarchical_dispatch_sends_less_than_all_to_all_across_nodes() -> None:
    coll = Collectives(parse_cluster("64xh100").accelerator)
    token_bytes = 2048 * 7168 * 2.0  # a rank's tokens of DeepSeek-V3 at 4K, tp 2 with SP
    plain = Routing(256, 8, EpDispatch.ALL_TO_ALL, 8, 4)
    deduped = Routing(256, 8, EpDispatch.HIERARCHICAL, 8, 4)
    across = AxisLink(64, 8, 8)
    assert coll.dispatch(token_bytes, plain, across) == coll.all_to_all(8 * token_bytes, across)
    assert coll.dispatch(token_bytes, deduped, across) < 0.6 * coll.dispatch(
        token_bytes, plain, across
    )
    inside = AxisLink(8, 8, 1)  # within a node both are the all-to-all over NVLink
    assert coll.dispatch(token_bytes, deduped, inside) == coll.dispatch(token_bytes, plain, inside)
    assert Collectives(coll._acc, lower_bound=True).dispatch(token_bytes, deduped, across) == 0.0


def test_older_plans_read_as_all_to_all_without_groups() -> None:
    doc = {"schema_version": 13, "train": {"runtime": {"fused_elementwise": True}}, "model": {}}
    out = upgrade(doc)
    assert out["schema_version"] == 15  # through version 14 to the current
    assert out["train"]["runtime"]["ep_dispatch"] == "alltoall"
    assert (out["model"]["routing_groups"], out["model"]["routing_group_top_k"]) == (1, 1)


def test_deepseek_config_routes_by_groups() -> None:
    from transformers import DeepseekV3Config, MixtralConfig

    from paraplan.profiler.shape import shape_of

    ds = shape_of(DeepseekV3Config())  # n_group 8, topk_group 4
    assert (ds.routing_groups, ds.routing_group_top_k) == (8, 4)
    mixtral = shape_of(MixtralConfig())
    assert (mixtral.routing_groups, mixtral.routing_group_top_k) == (1, 1)
    unlimited = shape_of(DeepseekV3Config(n_group=8, topk_group=8))
    assert (unlimited.routing_groups, unlimited.routing_group_top_k) == (1, 1)


def test_cli_records_the_dispatch_and_refuses_another(tmp_path) -> None:
    spec = "gpt:layers=2,hidden=256,heads=4,vocab=1024,seq=256,experts=8,top_k=2"
    base = [sys.executable, "-m", "paraplan", "plan", "--model", spec, "--cluster", "16xh100"]
    base += ["--global-batch", "64", "--runtime", "megatron", "--any-engine"]
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [*base, "--ep-dispatch", "hierarchical", "-o", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["train"]["runtime"]["ep_dispatch"] == "hierarchical"
    assert "8 per block, 2 per token; tokens dispatched once per node" in done.stdout
    bad = subprocess.run([*base, "--ep-dispatch", "deepep2"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "--ep-dispatch" in bad.stderr and "hierarchical" in bad.stderr


GROUPED = {
    "model_type": "deepseek_v3",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "n_group": 4,
    "topk_group": 2,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "max_position_embeddings": 64,
}


def test_grouped_routing_and_the_dispatch_reach_megatron(tmp_path) -> None:
    """A group-limited DeepSeek-style model planned for NeMo's runtime over two nodes (EP 16):
    the profile and the plan record 4 groups of which 2; the Megatron-LM export writes the flex
    dispatcher (DeepEP) and the groups, which megatron-core's own config reads as such, and the
    file read back prices the same dispatch; the hierarchical dispatch is the cheaper step."""
    pytest.importorskip("transformers")
    from paraplan.api import plan as make
    from paraplan.export.exporter import Costing, Target, export_plan
    from paraplan.export.megatron import read
    from profiler.hf import profile_hf
    from tests.export_cases import run_loaders

    profile = profile_hf(dict(GROUPED), seq_len=32)
    assert (profile.routing_groups, profile.routing_group_top_k) == (4, 2)
    fix = "dp=16,tp=1,pp=1,ep=16,zero=1,mbs=1,recompute=none,schedule=none"
    kw = dict(global_batch=32, seq_len=32, fix=fix, top_k=0, any_engine=True, runtime="nemo")
    plan = make(profile, "16xh100", **kw).plan  # type: ignore[arg-type]
    plain = make(profile, "16xh100", ep_dispatch="alltoall", **kw).plan  # type: ignore[arg-type]
    assert plan.train.runtime.ep_dispatch == EpDispatch.HIERARCHICAL
    assert (plan.model.routing_groups, plan.model.routing_group_top_k) == (4, 2)
    assert plan.predicted.step_time_s < plain.predicted.step_time_s
    text = export_plan(plan, Target.MEGATRON, Costing(profile, parse_cluster("16xh100"), plan)).text
    flags = text.splitlines()
    for line in (
        "--moe-token-dispatcher-type flex",
        "--moe-flex-dispatcher-backend deepep",
        "--moe-router-num-groups 4",
        "--moe-router-group-topk 2",
    ):
        assert line in flags
    said = read(text, world_size=16, source="g.args").runtime_says
    assert said is not None and said.ep_dispatch == EpDispatch.HIERARCHICAL
    again = read(text.replace("flex", "alltoall"), world_size=16, source="g.args").runtime_says
    assert again is not None and again.ep_dispatch == EpDispatch.ALL_TO_ALL
    pytest.importorskip("megatron.core")
    path = tmp_path / "grouped.args"
    path.write_text(text)
    core = run_loaders("megatron", [{"path": str(path), "world_size": 16, "dp": 16}])[0]
    assert (core["dispatcher"], core["flex_backend"]) == ("flex", "deepep")
    assert core["router_groups"] == [4, 2]


def test_torchtitan_export_says_where_the_dispatch_is_set() -> None:
    """torchtitan's job config has no dispatcher key (its config registry builds the token
    dispatcher): a plan priced with the once-per-node dispatch says so in the written file."""
    from paraplan.api import model_profile
    from paraplan.api import plan as make
    from paraplan.export.exporter import Costing, Target, export_plan

    spec = "gpt:layers=2,hidden=256,heads=4,vocab=1024,seq=256,experts=16,top_k=2"
    profile = model_profile(spec, seq_len=256, precision="bf16", source="spec")
    fix = "dp=16,tp=1,pp=1,ep=16,zero=2,mbs=1,recompute=none,schedule=none"
    kw = dict(global_batch=32, seq_len=256, fix=fix, top_k=0, any_engine=True)
    cluster = parse_cluster("16xh100")
    for dispatch, said in (("hierarchical", True), ("alltoall", False)):
        plan = make(profile, cluster, runtime="torchtitan", ep_dispatch=dispatch, **kw).plan  # type: ignore[arg-type]
        text = export_plan(plan, Target.TORCHTITAN, Costing(profile, cluster, plan)).text
        assert ("comm_backend='deepep'" in text) is said


def test_older_profiles_read_as_not_group_limited() -> None:
    """A version-10 profile (before the routing groups) reads as routing over every group (and
    is another profile than the grouped one: plans and caches keyed on it tell them apart)."""
    from paraplan.planner.profile_io import profile_from_dict, profile_to_dict
    from profiler.hf import profile_hf

    pytest.importorskip("transformers")
    grouped = profile_hf(dict(GROUPED), seq_len=32)
    doc = profile_to_dict(grouped)
    doc["schema_version"] = 10
    for key in ("routing_groups", "routing_group_top_k"):
        del doc["profile"][key]
    old = profile_from_dict(doc)
    assert (old.routing_groups, old.routing_group_top_k) == (1, 1)
    assert old.fingerprint() != grouped.fingerprint()


def test_megatron_file_with_other_groups_is_priced_with_its_own(tmp_path, capsys) -> None:
    """A Megatron-LM file that routes the grouped model over other groups than its config's is
    priced as it runs, and says so; groups without the groups per token are refused (exit 2)."""
    pytest.importorskip("transformers")
    from paraplan.api import plan as make
    from paraplan.cli import main
    from paraplan.export.exporter import Costing, Target, export_plan
    from profiler.hf import profile_hf

    model = tmp_path / "grouped.json"
    model.write_text(json.dumps({**GROUPED, "num_nextn_predict_layers": 0}))
    profile = profile_hf(json.loads(model.read_text()), seq_len=32)
    fix = "dp=16,tp=1,pp=1,ep=16,zero=1,mbs=1,recompute=none,schedule=none"
    kw = dict(global_batch=32, seq_len=32, fix=fix, top_k=0, any_engine=True, runtime="nemo")
    cluster = parse_cluster("16xh100")
    plan = make(profile, cluster, **kw).plan  # type: ignore[arg-type]
    text = export_plan(plan, Target.MEGATRON, Costing(profile, cluster, plan)).text
    assert "--moe-router-group-topk 2" in text.splitlines()
    base = ["plan", "--model", str(model), "--cluster", "16xh100", "--no-progress"]
    same = tmp_path / "same.args"
    same.write_text(text)
    assert main([*base, "--from-config", str(same)]) == 0
    assert "routed as configured" not in capsys.readouterr().out
    other = tmp_path / "other.args"
    other.write_text(text.replace("--moe-router-group-topk 2", "--moe-router-group-topk 1"))
    assert main([*base, "--from-config", str(other)]) == 0
    out = capsys.readouterr().out
    assert "experts routed as configured (1 of 4 groups; the model's own: 2 of 4)" in out
    bad = tmp_path / "bad.args"
    bad.write_text(text.replace("--moe-router-group-topk 2\n", ""))
    assert main([*base, "--from-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--moe-router-group-topk (none)" in err and "Traceback" not in err
