"""A DeepSeek-style model through the profile, the plan and the Megatron-LM export: dense first
blocks with their own MLP width, shared experts beside the routed ones, multi-head latent
attention. Judged by megatron-core itself (its `MLATransformerConfig` and `get_moe_layer_pattern`
built from the written file) against the Hugging Face config's own numbers. Before, every block
was written as MoE, the experts' width as `--ffn-hidden-size`, and no shared experts or latent
attention: a DeepSeek-V3 export built another model, silently."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
from pathlib import Path

import pytest

from paraplan.api import plan as make
from paraplan.export.exporter import Costing, Target, export_plan
from paraplan.export.megatron import read
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.model import ModelProfile
from paraplan.planner.plan import Plan
from paraplan.planner.plan_io import plan_from_dict
from paraplan.planner.profile_io import profile_from_dict, profile_to_dict
from tests.export_cases import run_loaders

pytest.importorskip("transformers")

DEEPSEEK = {
    "model_type": "deepseek_v3",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 768,  # the dense blocks' MLP
    "moe_intermediate_size": 128,  # each expert's
    "num_hidden_layers": 4,
    "first_k_dense_replace": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 2,
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "max_position_embeddings": 128,
}
SEQ = 32
CLUSTER = "8xh100"
FIX = "dp=8,tp=1,pp=1,ep=8,zero=2,mbs=1,recompute=none,schedule=none"


@functools.cache
def _profile() -> ModelProfile:
    from profiler.hf import profile_hf

    return profile_hf(dict(DEEPSEEK), seq_len=SEQ)


def _plan() -> tuple[Plan, Costing]:
    profile = _profile()
    plan = make(
        profile, CLUSTER, global_batch=16, seq_len=SEQ, fix=FIX, top_k=0, any_engine=True
    ).plan
    return plan, Costing(profile, parse_cluster(CLUSTER), plan)


def test_profile_and_plan_record_the_layout() -> None:
    """Against the config: blocks 0-1 dense (768 wide), 2-3 MoE (8 experts of 128, 2 shared of
    128), latent attention of ranks 64/32, heads of 32 + 16, values of 32."""
    profile = _profile()
    assert profile.moe_blocks == (False, False, True, True)
    assert (profile.experts, profile.ffn, profile.dense_ffn) == (8, 128, 768)
    assert profile.shared_expert_ffn == 2 * 128
    mla = profile.latent_attention
    assert mla is not None and profile.head_dim == 32 + 16
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim, mla.v_head_dim) == (
        64,
        32,
        16,
        32,
    )
    plan, _ = _plan()
    m = plan.model
    assert (m.dense_blocks, m.dense_ffn, m.shared_expert_ffn) == ((0, 1), 768, 256)
    assert m.latent_attention == mla
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.model == m


def test_megatron_core_builds_the_configured_model(tmp_path: Path) -> None:
    """The written flags, then megatron-core's own reading of the file: its MoE layer pattern,
    dense and expert widths, shared experts and latent attention are the config's."""
    plan, costing = _plan()
    text = export_plan(plan, Target.MEGATRON, costing).text
    flags = [line for line in text.splitlines() if line.startswith("--")]
    for line in (
        "--ffn-hidden-size 768",
        "--moe-ffn-hidden-size 128",
        "--moe-shared-expert-intermediate-size 256",
        "--moe-layer-freq [0]*2+[1]*2",
        "--multi-latent-attention",
        "--q-lora-rank 64",
        "--kv-lora-rank 32",
        "--qk-head-dim 32",
        "--qk-pos-emb-head-dim 16",
        "--v-head-dim 32",
    ):
        assert line in flags
    assert not any(f.startswith("--kv-channels") for f in flags)  # not MLA's head width
    if importlib.util.find_spec("megatron") is None:
        return
    path = tmp_path / "deepseek.args"
    path.write_text(text)
    core = run_loaders("megatron", [{"path": str(path), "world_size": 8, "dp": 8}])[0]
    assert core["moe_pattern"] == [0, 0, 1, 1]
    assert (core["ffn"], core["moe_ffn"], core["shared_expert_ffn"]) == (768, 128, 256)
    assert core["mla"] == [64, 32, 32, 16, 32]
    assert core["top_k"] == 2 and core["ep"] == 8


def test_reading_the_export_back_states_the_same_model() -> None:
    """The written file read back agrees with the profile; a file for another layout (other
    dense blocks, no shared experts, other ranks, plain attention) is refused as another
    model's, naming the flag and both values."""
    plan, costing = _plan()
    text = export_plan(plan, Target.MEGATRON, costing).text
    profile = _profile()

    def problem(edited: str) -> str | None:
        said = read(edited, world_size=8, source="d.args").model_says
        assert said is not None
        return said.mismatch(profile)

    assert problem(text) is None
    for old, new, words in (
        ("--moe-layer-freq [0]*2+[1]*2", "--moe-layer-freq [0]*1+[1]*3", "dense blocks 0, but"),
        ("--moe-layer-freq [0]*2+[1]*2", "", "no --moe-layer-freq gives dense blocks none"),
        ("--moe-shared-expert-intermediate-size 256", "", "gives 0, but"),
        ("--ffn-hidden-size 768", "--ffn-hidden-size 512", "--ffn-hidden-size gives 512"),
        ("--kv-lora-rank 32", "--kv-lora-rank 64", "--kv-lora-rank gives 64, but"),
        ("--q-lora-rank 64", "", "--q-lora-rank gives 0, but the model has 64"),
        ("--multi-latent-attention", "", "no --multi-latent-attention"),
    ):
        assert old in text
        got = problem(text.replace(old, new))
        assert got is not None and words in got and "another model" in got, (old, got)
    with pytest.raises(ValueError, match=re.escape("--moe-layer-freq '[0]*2' names 2 blocks")):
        read(text.replace("[0]*2+[1]*2", "[0]*2"), world_size=8, source="d.args")


def test_moe_configs_name_their_experts_in_several_ways() -> None:
    """Qwen2-MoE (`num_experts`) and DeepSeek-V2 (`n_routed_experts`) count their experts;
    before, both read as dense models (0 experts). Mixtral's layout is unchanged (no dense size
    set apart, no shared experts)."""
    from transformers import DeepseekV2Config, MixtralConfig, Qwen2MoeConfig

    from profiler.shape import shape_of

    qwen = shape_of(Qwen2MoeConfig(num_experts=60, moe_intermediate_size=1408))
    assert (qwen.experts, qwen.ffn, qwen.shared_expert_ffn) == (60, 1408, 5632)
    v2 = shape_of(DeepseekV2Config(n_routed_experts=64, n_shared_experts=2, q_lora_rank=None))
    assert (v2.experts, v2.ffn, v2.dense_ffn, v2.shared_expert_ffn) == (64, 1407, 11008, 2814)
    assert v2.latent is not None and v2.latent.q_lora_rank == 0
    mixtral = shape_of(MixtralConfig())
    assert (mixtral.experts, mixtral.ffn, mixtral.dense_ffn, mixtral.shared_expert_ffn) == (
        8,
        14336,
        0,
        0,
    )
    assert mixtral.latent is None


def test_older_documents_read_without_the_layout() -> None:
    """A version-12 plan and a version-9 profile read as recording none of it (their exports
    write what they wrote before)."""
    plan, _ = _plan()
    doc = plan.to_dict()
    doc["schema_version"] = 12
    for key in ("dense_blocks", "dense_ffn", "shared_expert_ffn", "latent_attention"):
        del doc["model"][key]
    old = plan_from_dict(doc).model
    assert (old.dense_blocks, old.dense_ffn, old.shared_expert_ffn) == ((), 0, 0)
    assert old.latent_attention is None
    profile_doc = profile_to_dict(_profile())
    profile_doc["schema_version"] = 9
    for key in ("dense_ffn", "shared_expert_ffn", "latent_attention"):
        del profile_doc["profile"][key]
    read_back = profile_from_dict(profile_doc)
    assert read_back.latent_attention is None and read_back.dense_ffn == 0


@pytest.mark.parametrize(
    ("name", "module", "config"),
    [
        ("deepseek-v3", "deepseek_v3", "deepseek_v3_671b"),
        ("gpt-oss-120b", "gpt_oss", "gpt_oss_120b"),
    ],
)
def test_torchtitan_export_names_the_models_own_configuration(
    name: str, module: str, config: str, tmp_path: Path
) -> None:
    """A plan of a MoE preset torchtitan ships names torchtitan's own configuration function
    for it, and torchtitan's config manager, given that function and the written file, reads
    back the plan's degrees (expert parallelism included) and batch."""
    plan, costing = _plan()
    plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, name=name))
    text = export_plan(plan, Target.TORCHTITAN, costing).text
    assert f"--module {module} --config {config} " in text
    if importlib.util.find_spec("torchtitan") is None:
        return
    path = tmp_path / "job.toml"
    path.write_text(text)
    item = {"path": str(path), "world_size": 8, "module": module, "config": config}
    got = run_loaders("torchtitan", [item])[0]
    assert (got["shard"], got["tp"], got["pp"], got["ep"]) == (8, 1, 1, 8)
    assert (got["local_batch"], got["global_batch"], got["seq_len"]) == (1, 16, SEQ)


def test_executor_refuses_expert_parallelism_over_dense_blocks() -> None:
    """paraplan's executor shards every block's experts (Mixtral's layout), so a plan with
    ep > 1 over a model with dense blocks is named as one it cannot run, and the search for an
    executor plan says so when nothing else is left; ep=1 stays runnable."""
    from paraplan.planner.capabilities import plan_gaps

    plan, _ = _plan()
    gaps = plan_gaps(plan)
    assert any("ep=8 over a model whose first or other blocks have no experts" in g for g in gaps)
    with pytest.raises(ValueError, match="have no experts"):
        make(_profile(), CLUSTER, global_batch=16, seq_len=SEQ, fix=FIX, top_k=0)
    dense_ep = FIX.replace("ep=8", "ep=1")
    runnable = make(_profile(), CLUSTER, global_batch=16, seq_len=SEQ, fix=dense_ep, top_k=0)
    assert not any("no experts" in g for g in plan_gaps(runnable.plan))
