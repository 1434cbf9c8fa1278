"""Traced MoE experts run as one batched matmul over each 3-D expert weight (as a grouped GEMM
does), so a block's backward transients hold each expert weight's gradient once. Computing
them expert by expert with the weight indexed per expert made every expert's backward
materialize a zero gradient of the whole weight: Mixtral-8x7B's blocks were priced 4.5 GiB of
backward transients per sequence (1.7x their expert weights), DeepSeek-V3's 30.5 GiB."""

from __future__ import annotations

import pytest

import profiler.moe as moe
from profiler.hf import profile_hf

pytest.importorskip("transformers")

MIXTRAL = {
    "model_type": "mixtral",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 128,
}
SEQ = 32  # 64 (token, expert) assignments: 8 to each of the 8 experts


def _one_by_one(self, rows):
    """The experts expert by expert, each indexing its weight (every shape's path before)."""
    return moe.torch.stack([moe._expert_ffn(self, e, part) for e, part in enumerate(rows)])


def test_expert_backward_holds_each_weight_gradient_once(monkeypatch) -> None:
    """Against the bytes of the block's expert weights (bf16): batched, the block's backward
    transients stay under them (the gate-and-up weight's gradient, then the down weight's);
    expert by expert they exceed them. FLOPs, parameters and saved bytes are the same."""
    batched = profile_hf(dict(MIXTRAL), seq_len=SEQ)
    monkeypatch.setattr(moe, "_experts_batched", _one_by_one)
    looped = profile_hf(dict(MIXTRAL), seq_len=SEQ)
    block, old = batched.layers[1], looped.layers[1]
    weights = 2 * block.expert_params  # bf16 bytes of the 8 experts' weights
    assert block.expert_params == 8 * 3 * 256 * 512
    assert block.bwd_tmp_bytes < weights < old.bwd_tmp_bytes
    assert (block.fwd_flops, block.bwd_flops) == (old.fwd_flops, old.bwd_flops)
    assert block.act_tp_bytes + block.act_replicated_bytes == (
        old.act_tp_bytes + old.act_replicated_bytes
    )
