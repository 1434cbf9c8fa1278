"""FLOPs of one aten op: PyTorch's own formulas (`torch.utils.flop_counter.flop_registry`,
the ones FlopCounterMode uses), plus the CPU fused attention kernels it misses.

FlopCounterMode has no entry for `aten._scaled_dot_product_flash_attention_for_cpu` (the kernel
SDPA picks on CPU), so attention would count as zero there (../shared/TORCH-NOTES.md). We count
it with the same formulas as the CUDA flash kernel: QK^T and AV over every (query, key) pair.
Causal masking is NOT discounted — neither by FlopCounterMode nor by the math backend's explicit
matmuls, nor by Narayanan et al. 2021 Eq. 3 — so every count here agrees with those (see
docs/cost-model.md, "FLOPs").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from paraplan.planner.model import LayerCost, attention_pairs

_aten = torch.ops.aten
_CPU_SDPA = _aten._scaled_dot_product_flash_attention_for_cpu
_CPU_SDPA_BWD = _aten._scaled_dot_product_flash_attention_for_cpu_backward


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs (2 per multiply-add) of one dispatched op; 0 for ops without a formula."""
    packet = func._overloadpacket
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    if packet is _CPU_SDPA:
        q, k, v = args[:3]
        return int(sdpa_flop_count(q.shape, _as_q_heads(k, q), _as_q_heads(v, q)))
    if packet is _CPU_SDPA_BWD:
        grad_out, q, k, v = args[:4]
        kq, vq = _as_q_heads(k, q), _as_q_heads(v, q)
        return int(sdpa_backward_flop_count(grad_out.shape, q.shape, kq, vq))
    return 0


def _as_q_heads(kv: Any, q: Any) -> tuple[int, ...]:
    """`kv`'s shape with the query's head count: under grouped-query attention (K/V heads
    shared by groups of query heads) every query head still multiplies its whole K and V, and
    torch 2.11's `sdpa_flop_count` refuses K/V with fewer heads than Q (2.13 accepts them)."""
    return (*kv.shape[:-3], q.shape[-3], *kv.shape[-2:])


def is_attention_op(func: Any) -> bool:
    """Whether `func` is a fused attention kernel (its FLOPs are the attention core's)."""
    return "scaled_dot_product" in str(func._overloadpacket) or "attention" in str(
        func._overloadpacket
    )


def windowed(layer: LayerCost, seq_len: int, window: int, attn_bwd_flops: float) -> LayerCost:
    """A traced block whose attention has a sliding window of `window` keys per query. The
    trace counts the attention core over every (query, key) pair (`attention.FusedAttention`
    replaces the mask by the causal flag, and no counter reads an explicit mask), so its
    attention-core FLOPs, forward and `attn_bwd_flops` backward (per sequence, as counted:
    2.5x the forward for a fused kernel, 2x for eager matmuls), are cut to the window's band
    (`attention_pairs`), and the block records its window (`LayerCost.attn_window`: what the
    exporters write); a window as long as the sequence changes nothing."""
    dense, pairs = seq_len * seq_len, attention_pairs(seq_len, window)
    if pairs >= dense or layer.attn_core_fwd_flops <= 0:
        return layer
    kept = pairs / dense
    return replace(
        layer,
        attn_window=window,
        attn_core_fwd_flops=layer.attn_core_fwd_flops * kept,
        fwd_flops=layer.fwd_flops - layer.attn_core_fwd_flops * (1.0 - kept),
        bwd_flops=max(0.0, layer.bwd_flops - attn_bwd_flops * (1.0 - kept)),
    )
