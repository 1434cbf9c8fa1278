"""What autocast over fp32 weights keeps for backward beyond a profile traced in bf16
(`mixed_precision.autocast_extra_bytes`), against the real modules: the bytes of every tensor
autograd saves (parameters left out, each storage once), one forward under `torch.autocast`
on fp32 weights, less one forward of the same model cast to bf16; the model as the executor
runs it (`to_chain_module`), which is what a traced profile prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import paraplan
from paraplan.executor.convert import to_chain_module
from paraplan.planner.cost.mixed_precision import autocast_extra_bytes, cached_weight_bytes
from paraplan.planner.strategy import Recompute, Schedule, Strategy

BATCH, SEQ = 4, 64
CONFIGS = {
    "gpt2": {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 3,
        "n_embd": 128,
        "n_head": 4,
        "vocab_size": 512,
        "n_positions": SEQ,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 3,
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": SEQ,
        "tie_word_embeddings": False,
    },
}


def _saved_bytes(
    model: torch.nn.Module, ids: torch.Tensor, autocast: bool, micro_batches: int = 1
) -> int:
    """Bytes of every storage autograd saves over the forwards of `micro_batches` slices of
    `ids`, all in one autocast context (a pipeline's `schedule.step`, graphs kept)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = [model(x) for x in ids.chunk(micro_batches)]  # (b, T, V) each, kept
    del logits
    return sum(seen.values())


def _model(family: str, tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[family]))
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).train()
    return to_chain_module(hf), path  # what the executor runs, and so what the profile traces


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_autocast_keeps_what_the_planner_adds(family: str, tmp_path: Path) -> None:
    model, path = _model(family, tmp_path)
    ids = torch.randint(0, 512, (BATCH, SEQ))
    under_autocast = _saved_bytes(model, ids, autocast=True)
    traced_bf16 = _saved_bytes(model.to(torch.bfloat16), ids, autocast=False)
    profile = paraplan.model_profile(str(path), seq_len=SEQ, precision="bf16")
    s = Strategy(dp=1, tp=1, pp=1, micro_batch_size=BATCH, recompute=Recompute.NONE)
    layers = range(len(profile.layers))
    priced = autocast_extra_bytes(s, layers, profile, 1.0, Recompute.NONE)
    measured = under_autocast - traced_bf16
    assert measured > 0
    assert priced == pytest.approx(measured, rel=0.05), (priced, measured)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_pipeline_holds_one_cast_of_each_weight(family: str, tmp_path: Path) -> None:
    """Two micro-batches in flight in one autocast context, as a pipeline stage runs them:
    autocast's cache gives both the same bf16 copy of each weight, so the weights count once
    (`cached_weight_bytes`) and the rest per micro-batch."""
    model, path = _model(family, tmp_path)
    ids = torch.randint(0, 512, (BATCH, SEQ))
    under_autocast = _saved_bytes(model, ids, autocast=True, micro_batches=2)
    traced_bf16 = _saved_bytes(model.to(torch.bfloat16), ids, autocast=False, micro_batches=2)
    profile = paraplan.model_profile(str(path), seq_len=SEQ, precision="bf16")
    s = Strategy(dp=1, tp=1, pp=2, schedule=Schedule.ONE_F_ONE_B, micro_batch_size=BATCH // 2)
    layers = range(len(profile.layers))
    per_mb = autocast_extra_bytes(s, layers, profile, 1.0, Recompute.NONE)
    weights = cached_weight_bytes(s, layers, profile, 1.0)
    measured = under_autocast - traced_bf16
    assert weights > 0.2 * measured  # the cache's share is not negligible here
    assert 2 * per_mb + weights == pytest.approx(measured, rel=0.05), (per_mb, weights, measured)
