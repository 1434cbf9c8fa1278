"""Heads wider than hidden / heads (Qwen3, Gemma, GPT-OSS: `head_dim`): the spec's sizes, the
GEMM shapes the cost model reads and Megatron-LM's `--kv-channels` in an export (read by
megatron-core's own config). Spec against trace: tests/test_profiler.py."""

from __future__ import annotations

from pathlib import Path

import paraplan
from paraplan.export.exporter import Target, export_plan
from paraplan.planner.cost.compute import layer_gemms
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from tests.export_cases import run_loaders

QWEN3_32B = "llama:layers=64,hidden=5120,heads=64,kv_heads=8,head_dim=128,ffn=25600,vocab=151936"
"""Qwen3-32B's sizes (its Hugging Face config.json), less the per-head q/k norms."""


def test_head_dim_widens_q_and_the_attention_output() -> None:
    """By hand: Q and the output projection are 5120 x 8192 (64 heads of 128), K and V
    5120 x 1024; the MLP 3 x 5120 x 25600; the attention core 4 s^2 x 8192 FLOPs."""
    spec = parse_model(QWEN3_32B)
    h, q, kv, f = 5120, 64 * 128, 8 * 128, 25600
    dense, _ = spec.block_params()
    assert dense == h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h
    profile = spec.to_profile(4096)
    block = next(x for x in profile.layers if x.kind == LayerKind.BLOCK)
    assert block.attn_core_fwd_flops == 4 * 4096**2 * q
    gemms = layer_gemms(profile, block, tp=8)
    assert gemms is not None
    assert [(g.n, g.k) for g in gemms] == [
        ((q + 2 * kv) // 8, h),
        (h, q // 8),
        (2 * f // 8, h),
        (h, f // 8),
    ]


def test_megatron_export_carries_the_head_width(tmp_path: Path) -> None:
    plan = paraplan.plan(
        QWEN3_32B,
        "16xh100",
        global_batch=32,
        seq_len=4096,
        fix="dp=2,tp=8,pp=1,zero=1,recompute=full,mbs=1",
        top_k=0,
    ).plan
    assert plan.model.head_dim == 128
    text = export_plan(plan, Target.MEGATRON, None).text
    assert "--kv-channels 128" in text
    (tmp_path / "q.args").write_text(text)
    (view,) = run_loaders(
        "megatron", [{"path": str(tmp_path / "q.args"), "world_size": 16, "dp": 2}]
    )
    assert view["tp"] == 8 and view["kv_channels"] == 128  # megatron-core read it
