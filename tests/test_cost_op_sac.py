"""torchtitan's per-operator selective checkpointing (`Runtime.selective =
EVERY_OTHER_MATMUL`): the matmuls the cost model says it recomputes are the ones a real
selective-checkpoint policy of the same rule recomputes in a Hugging Face Llama block, and the
step it prices sits between attention-core selective and full recompute."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Runtime, SelectiveRecompute, TrainConfig
from paraplan.planner.cost.compute import every_other_matmul
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.strategy import Recompute, Strategy

transformers = pytest.importorskip("transformers")


def _recomputed_mm_flops(layer: torch.nn.Module, x: torch.Tensor, pos: tuple) -> float:
    """FLOPs of the matmuls a policy of torchtitan's rule (count the block's matmuls in order,
    save the odd ones, recompute the even ones) leaves to be recomputed: torch 2.13 consults
    the policy in forward only, so the matmuls it marks for recompute are summed there; the
    backward then checks the recomputation runs."""
    recomputed = [0.0]

    def context():
        count = [0]

        def policy(ctx, func, *args, **kwargs):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                count[0] += 1
                if count[0] % 2 == 0:
                    a, b = args[-2], args[-1]
                    recomputed[0] += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
                    return CheckpointPolicy.PREFER_RECOMPUTE
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    def block(t: torch.Tensor) -> torch.Tensor:
        out = layer(t, position_embeddings=pos)
        return out[0] if isinstance(out, tuple) else out

    out = checkpoint(block, x, use_reentrant=False, context_fn=context)
    out.sum().backward()
    assert x.grad is not None
    return recomputed[0]


def test_every_other_matmul_matches_a_real_selective_checkpoint_of_a_llama_block():
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=176,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_hidden_layers=1,
        vocab_size=128,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(cfg, layer_idx=0)
    rope = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    seq = 12
    x = torch.randn(1, seq, cfg.hidden_size, requires_grad=True)
    pos = rope(x, torch.arange(seq)[None])
    measured = _recomputed_mm_flops(layer, x, pos)
    spec = dataclasses.replace(
        PRESETS["llama3-8b"], hidden=64, ffn=176, heads=4, kv_heads=1, seq=seq, layers=1
    )
    profile = spec.to_profile(seq_len=seq)
    predicted = sum(2.0 * seq * g.n * g.k for g in every_other_matmul(profile, 1, gated=True))
    assert measured == pytest.approx(predicted)


def test_per_op_selective_costs_between_attention_core_selective_and_full():
    """Recomputing every other matmul is dearer than recomputing attention's core alone (with
    a fused kernel that core is one kernel's forward) and cheaper than the whole forward."""
    seq = 8192
    profile = PRESETS["llama3-8b"].to_profile(seq_len=seq)
    cluster = parse_cluster("8xh100")
    s = Strategy(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1, recompute=Recompute.SELECTIVE)

    def step(rc: Recompute, kind: SelectiveRecompute) -> float:
        train = TrainConfig(global_batch=8, seq_len=seq, runtime=Runtime(selective=kind))
        ev = Evaluator(profile, cluster, train)
        return ev.evaluate(dataclasses.replace(s, recompute=rc)).step_time_s

    core = step(Recompute.SELECTIVE, SelectiveRecompute.ATTENTION_CORE)
    per_op = step(Recompute.SELECTIVE, SelectiveRecompute.EVERY_OTHER_MATMUL)
    full = step(Recompute.FULL, SelectiveRecompute.ATTENTION_CORE)
    assert core < per_op < full
