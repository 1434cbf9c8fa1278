"""A DeepSeek-V3-style model traced on the meta device: multi-head latent attention (values
narrower than queries and keys), a first dense block, routed and shared experts. Counted by
hand from the config's sizes (Hugging Face's DeepseekV3 modules, random weights, no download)."""

from __future__ import annotations

import json

import pytest

from paraplan.api import model_profile
from paraplan.cli import main

pytest.importorskip("transformers")

CONFIG = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "moe_intermediate_size": 256,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 128,
    "q_lora_rank": 256,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "vocab_size": 32000,
    "n_group": 4,
    "topk_group": 2,
}
SEQ = 1024
H, HEADS, QK, V = 1024, 8, 96, 64
# q_a, q_a norm, q_b, kv_a (latent 128 + rope 32), kv_a norm, kv_b (nope 64 + v 64 per head), o
ATTN_PARAMS = H * 256 + 256 + 256 * HEADS * QK + H * 160 + 128 + 128 * HEADS * 128 + HEADS * V * H
ATTN_MATMUL = H * 256 + 256 * HEADS * QK + H * 160 + 128 * HEADS * 128 + HEADS * V * H
EXPERT = 3 * H * 256  # gate, up, down of one expert (SwiGLU)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return model_profile(str(path), seq_len=SEQ, source="trace")


def test_mla_traces_with_values_narrower_than_queries(profile) -> None:
    """The attention output is as wide as the values (heads x 64, what o_proj takes): the trace
    used to shape it as the queries (heads x 96) and failed in o_proj. The core counts the
    scores and the values at the queries' width (values zero-padded, as FlashAttention-2 runs
    it): 4 s^2 heads x 96 per sequence."""
    block = profile.layers[2]
    assert block.attn_core_fwd_flops == pytest.approx(4 * SEQ**2 * HEADS * QK, rel=1e-6)


def test_shared_experts_are_dense_and_routed_experts_are_not(profile) -> None:
    """A MoE block's parameters: attention, two norms, the router and the shared expert dense
    (every token runs them, every rank holds them); the 16 routed experts apart (split by
    expert parallelism). Its forward: the projections, the router, top-4 routed experts and the
    shared one per token, beside the attention core."""
    dense_block, moe_block = profile.layers[1], profile.layers[2]
    assert profile.experts == 16 and profile.top_k == 4
    assert moe_block.expert_params == 16 * EXPERT
    assert moe_block.params == ATTN_PARAMS + 2 * H + 16 * H + EXPERT
    assert dense_block.expert_params == 0
    assert dense_block.params == ATTN_PARAMS + 2 * H + 3 * H * 2816
    per_token = 2 * (ATTN_MATMUL + 16 * H + 4 * EXPERT + EXPERT)
    assert moe_block.fwd_flops - moe_block.attn_core_fwd_flops == pytest.approx(
        per_token * SEQ, rel=1e-3
    )


def test_deepseek_v3_has_no_analytic_spec(capsys: pytest.CaptureFixture[str]) -> None:
    """The `deepseek-v3` preset is traced from its Hugging Face config; asked for the analytic
    spec, the planner says so in one line, exit status 2, before any tracing."""
    argv = ["plan", "--model", "deepseek-v3", "--model-source", "spec", "--cluster", "8xh100"]
    code = main([*argv, "--global-batch", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "--model-source auto or trace" in err
    assert len(err.strip().splitlines()) == 1


def test_head_width_is_the_scores_width(profile) -> None:
    """Under multi-head latent attention the profile's head width is the query and key heads'
    (qk_nope_head_dim + qk_rope_head_dim = 96; transformers' `head_dim` is the rotary part
    alone, 32): the width the traced attention core computes its scores over, so what the
    planner derives from it (the K/V a context-parallel ring passes, q_dim) is that core's."""
    assert profile.head_dim == QK
    assert profile.layers[2].attn_core_fwd_flops == pytest.approx(
        4 * SEQ**2 * profile.q_dim, rel=1e-6
    )
