"""A meta trace stops at the first block of the model's final run of identical blocks and
repeats it (`profiler.api.traced_count`): a few dense blocks before the MoE ones (DeepSeek-V3's
first 3 of 61) no longer make the profiler trace every block (61 blocks with 256 experts each
took 3 minutes and wrote a 94 MB profile, over `paraplan plan --profile`'s 64 MiB input limit).
Checked against the full trace of the same model."""

from __future__ import annotations

import pytest
from torch import nn

import profiler.api as api
from profiler.hf import profile_hf

pytest.importorskip("transformers")

DS_CONFIG = {
    "model_type": "deepseek_v3",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 6,
    "first_k_dense_replace": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "max_position_embeddings": 256,
    "n_group": 1,
    "topk_group": 1,
}


def _blocks(*widths: int) -> tuple[nn.Module, ...]:
    return tuple(nn.Linear(4, w) for w in widths)


@pytest.mark.parametrize(
    ("widths", "traced"),
    [
        ((4, 4, 4, 4, 4), 2),  # uniform: the first and one more, as before
        ((8, 4, 4, 4), 2),  # the first differs (it follows the embedding)
        ((4, 4, 4, 8, 8, 8, 8), 4),  # a dense prefix of 3, then a run of 4
        ((4, 8, 4, 8, 4, 8), 6),  # alternating: no final run, every block
        ((4, 4), 2),
        ((4,), 1),
    ],
)
def test_traced_count_stops_at_the_final_run(widths, traced) -> None:
    assert api.traced_count(_blocks(*widths)) == traced


def test_dense_prefix_trace_matches_the_full_trace(monkeypatch) -> None:
    """2 dense blocks and 4 MoE blocks: 3 traced (5 op graphs with the embedding and the head,
    against 8), and every block's parameters, FLOPs, and bytes saved for backward (in the trace
    and under autocast), TP-sharded and replicated, as the full trace counts them. (The
    repeated block's transients and op count carry the boundary effect a uniform model's
    repeated block always has: it is traced next to the head.) Before 2026-11-28 the tracers
    keyed storages by `id()` without forgetting freed ones, so a later storage taking a freed
    one's id was skipped or counted replicated: the full trace's blocks differed by a few KB
    from run to run."""
    short = profile_hf(dict(DS_CONFIG), seq_len=128)
    monkeypatch.setattr(api, "traced_count", lambda blocks: len(blocks))
    full = profile_hf(dict(DS_CONFIG), seq_len=128)
    assert (len(short.op_graphs), len(full.op_graphs)) == (5, 8)
    assert len(short.layers) == len(full.layers) == 8
    for a, b in zip(short.layers, full.layers, strict=True):
        assert (a.name, a.params, a.expert_params) == (b.name, b.params, b.expert_params)
        assert (a.fwd_flops, a.bwd_flops) == (b.fwd_flops, b.bwd_flops)
        assert a.attn_core_fwd_flops == b.attn_core_fwd_flops
        assert a.act_attn_core_bytes == b.act_attn_core_bytes
        assert (a.act_tp_bytes, a.act_replicated_bytes) == (b.act_tp_bytes, b.act_replicated_bytes)
        assert a.autocast_saved_bytes == b.autocast_saved_bytes
    assert short.num_params == full.num_params
    assert [x.expert_params > 0 for x in short.layers[1:-1]] == [False] * 2 + [True] * 4
