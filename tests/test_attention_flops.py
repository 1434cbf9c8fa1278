"""FLOPs of the fused CPU attention kernel the meta-mode profile runs SDPA as
(`profiler/attention.py`), under grouped-query attention: K/V with fewer heads than Q.

The reference is the same kernel with K and V repeated to the query's head count (what
Hugging Face does when it cannot share heads): every query head multiplies its whole K and V
either way. torch 2.11's `sdpa_flop_count` refused the shared-head shapes outright (the GPU
image's trace of the executor's Llama, which passes no mask and so shares heads, 2026-11-26).
"""

from __future__ import annotations

import pytest
import torch

from paraplan.profiler.flops import op_flops

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_grouped_query_attention_counts_as_repeated_heads(kv_heads: int) -> None:
    b, q_heads, s, d = 2, 8, 64, 16
    q = torch.randn(b, q_heads, s, d)
    k, v = torch.randn(b, kv_heads, s, d), torch.randn(b, kv_heads, s, d)
    group = q_heads // kv_heads
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    fwd = op_flops(_FWD, (q, k, v), {}, None)
    assert fwd == op_flops(_FWD, (q, k_rep, v_rep), {}, None)
    assert fwd == 2 * 2 * b * q_heads * s * s * d  # QK^T and AV, 2 FLOPs per multiply-add
    grad = torch.randn_like(q)
    bwd = op_flops(_BWD, (grad, q, k, v), {}, None)
    assert bwd == op_flops(_BWD, (grad, q, k_rep, v_rep), {}, None)
    assert bwd == 2 * fwd + fwd // 2  # dV, dP, dQ, dK and the recomputed QK^T: 5 GEMMs
