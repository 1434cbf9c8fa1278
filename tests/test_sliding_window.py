"""Sliding-window (banded) attention: the pairs its FLOPs count, by brute force; gpt-oss's sizes
against its model card; a traced Hugging Face config against the spec, block by block; which
blocks a config windows (transformers' own config classes); and the step it prices."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model import LayerKind, attention_pairs
from paraplan.planner.model_parse import parse_model
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.strategy import Strategy


@pytest.mark.parametrize(("seq", "window"), [(8, 3), (16, 1), (16, 15), (64, 16), (10, 10)])
def test_band_pairs_by_brute_force(seq: int, window: int) -> None:
    """Every (i, j) with |i - j| < w counted one by one: the band both sides of the diagonal;
    the causal kernel keeps j <= i of it, the diagonal once: (band + s) / 2."""
    band = sum(1 for i in range(seq) for j in range(seq) if abs(i - j) < window)
    causal = sum(1 for i in range(seq) for j in range(i + 1) if i - j < window)
    assert attention_pairs(seq, window) == band
    assert causal == (band + seq) // 2
    assert attention_pairs(seq, 0) == attention_pairs(seq, seq) == seq * seq


def test_gpt_oss_presets_match_the_model_card() -> None:
    """OpenAI 2025, gpt-oss model card, Table 1: 116.83B and 20.91B parameters, 5.13B and
    3.61B active (top 4 of the experts, and one of the two vocabulary tables)."""
    for name, total, active in (
        ("gpt-oss-120b", 116.83e9, 5.13e9),
        ("gpt-oss-20b", 20.91e9, 3.61e9),
    ):
        spec = PRESETS[name]
        assert spec.num_params == pytest.approx(total, abs=0.005e9)
        dense, expert = spec.block_params()
        act = spec.layers * (dense + expert * spec.top_k // spec.experts)
        act += spec.vocab * spec.hidden + spec.hidden  # a vocabulary table, the final norm
        assert act == pytest.approx(active, abs=0.005e9)
        windows = [spec.window_of(i) for i in range(spec.layers)]
        assert windows[:4] == [128, 0, 128, 0] and windows.count(0) == spec.layers // 2


def test_windowed_block_by_hand() -> None:
    """gpt-oss-20b at 4096 tokens: block 0 (banded) and block 1 (dense) differ only in the
    attention core, 4 x q x pairs with q = 64 heads x 64; what a block keeps is the same (the
    fused kernel keeps its output and log-sum-exp either way)."""
    profile = PRESETS["gpt-oss-20b"].to_profile(4096)
    b0, b1 = (
        x for x in profile.layers if x.kind == LayerKind.BLOCK and x.name in ("block.0", "block.1")
    )
    q, s, w = 64 * 64, 4096, 128
    assert b1.attn_core_fwd_flops == 4 * q * s * s
    assert b0.attn_core_fwd_flops == 4 * q * (s * (2 * w - 1) - w * (w - 1))
    assert b1.fwd_flops - b0.fwd_flops == b1.attn_core_fwd_flops - b0.attn_core_fwd_flops
    assert b1.bwd_flops - b0.bwd_flops == 2 * (b1.fwd_flops - b0.fwd_flops)
    assert (b0.act_tp_bytes, b0.act_replicated_bytes) == (b1.act_tp_bytes, b1.act_replicated_bytes)


def test_a_window_as_long_as_the_sequence_is_full_attention() -> None:
    spec = PRESETS["gpt-oss-20b"]
    full = dataclasses.replace(spec, sliding_window=0, full_attention_every=0)
    assert dataclasses.replace(spec, sliding_window=4096).to_profile(4096) == full.to_profile(4096)
    assert spec.to_profile(4096) != full.to_profile(4096)


def test_full_attention_every_needs_a_window() -> None:
    with pytest.raises(ValueError, match="full_attention_every=2 given without sliding_window"):
        parse_model(
            "moe:layers=4,hidden=256,heads=4,vocab=100,experts=4,top_k=2,full_attention_every=2"
        )
    spec = parse_model("llama:layers=4,hidden=256,heads=4,vocab=100,sliding_window=64")
    assert [spec.window_of(i) for i in range(4)] == [64] * 4  # Mistral: every block


def test_banded_blocks_make_the_step_faster_and_hold_the_same() -> None:
    """The same strategy for gpt-oss-20b with no band, a band of 1024 and one of 128: faster
    the narrower the band, by the attention-core pairs it removes (the kernel skips the tiles
    outside the band; its rate does not change), and with the same memory."""
    spec = PRESETS["gpt-oss-20b"]
    cluster = parse_cluster("8xh100")
    train = TrainConfig(global_batch=64, seq_len=8192)
    s = Strategy(dp=8, tp=1, pp=1, ep=8, zero_stage=1, micro_batch_size=1)
    est = {
        w: Evaluator(
            dataclasses.replace(spec, sliding_window=w).to_profile(8192), cluster, train
        ).evaluate(s)
        for w in (8192, 1024, 128)
    }
    assert est[8192].step_time_s > est[1024].step_time_s > est[128].step_time_s
    assert len({e.memory.total_bytes for e in est.values()}) == 1
    removed = {w: 8192**2 - attention_pairs(8192, w) for w in (1024, 128)}
    saved = {w: est[8192].step_time_s - est[w].step_time_s for w in (1024, 128)}
    assert saved[1024] / saved[128] == pytest.approx(removed[1024] / removed[128], rel=1e-6)


def test_trace_counts_the_band_as_the_spec_does() -> None:
    """A small gpt-oss config traced on the meta device (transformers' GptOss model: eager
    attention with sinks, traced as the fused kernel; biased experts in (E, in, out) layout)
    against the spec of the same sizes: every block's forward and backward FLOPs, attention
    core, expert parameters, and what it keeps (the fused kernel's output and log-sum-exp,
    not the s x s probabilities). The counter counts a fused backward as 2.5 forwards
    (`sdpa_backward_flop_count`), the spec as 2: the dense rest is equal."""
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    from paraplan.profiler.hf import profile_hf

    one = (1, 1, 128, 64)  # the counter's backward over forward, whatever the shape
    ratio = sdpa_backward_flop_count(one, one, one, one) / sdpa_flop_count(one, one, one)

    config = {
        "model_type": "gpt_oss",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 256,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 1000,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    traced = profile_hf(config, seq_len=1024, mode="meta")
    spec = dataclasses.replace(
        PRESETS["gpt-oss-20b"],
        layers=4,
        hidden=256,
        heads=8,
        kv_heads=2,
        ffn=256,
        expert_ffn=256,
        vocab=1000,
        experts=8,
        top_k=2,
        seq=1024,
    )
    for got, want in zip(traced.layers[1:-1], spec.to_profile(1024).layers[1:-1], strict=True):
        assert got.attn_core_fwd_flops == pytest.approx(want.attn_core_fwd_flops)
        assert got.fwd_flops == pytest.approx(want.fwd_flops)
        fused = ratio * got.attn_core_fwd_flops
        assert got.bwd_flops - fused == pytest.approx(want.bwd_flops - 2 * want.attn_core_fwd_flops)
        assert got.act_attn_core_bytes < 1024 * 1024 * 8  # no (1024 x 1024 x heads) scores
        assert got.expert_params == want.expert_params
        assert got.attn_window == want.attn_window  # what the exports write
    assert [x.attn_window for x in traced.layers[1:-1]] == [128, 0, 128, 0]


def test_which_blocks_a_config_windows() -> None:
    pytest.importorskip("transformers")
    from transformers import Gemma3TextConfig, GptOssConfig, MistralConfig, Qwen2Config

    from paraplan.profiler.shape import windows_of

    assert windows_of(GptOssConfig(num_hidden_layers=4)) == (128, 0, 128, 0)
    gemma = windows_of(Gemma3TextConfig(num_hidden_layers=12))
    assert gemma == (*(4096,) * 5, 0, *(4096,) * 5, 0)
    assert windows_of(MistralConfig(num_hidden_layers=3)) == (4096,) * 3
    assert windows_of(Qwen2Config(num_hidden_layers=3)) == ()  # use_sliding_window off
