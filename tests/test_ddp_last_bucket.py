"""torch DDP's last gradient bucket, as the planner estimates it (`data_parallel.
ddp_last_bucket_bytes`), against torch's own bucket assignment on the real models: the last
bucket's all-reduce starts only when backward ends, so its size is what DDP exposes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

import paraplan
from paraplan.planner.cost.data_parallel import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    ddp_last_bucket_bytes,
)

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
LLAMA_MID = {  # untied, several 25 MiB buckets
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 6,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1408,
    "vocab_size": 8192,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def _torch_buckets(config: Path) -> list[float]:
    """Gradient bytes (fp32) of each bucket torch's DDP assigns, in the order backward fills
    them (parameters in reverse: DDP's rebuilt order, the embedding's last)."""
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config))
    params = list(reversed(list(model.parameters())))
    buckets, _ = dist._compute_bucket_assignment_by_size(
        params, [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES], [False] * len(params)
    )
    return [sum(params[i].numel() * 4.0 for i in b) for b in buckets]


@pytest.mark.parametrize(
    ("name", "seq"), [("gpt2-tiny", 128), ("gpt-small", 256), ("llama-mid", 64)]
)
def test_last_bucket_matches_torchs_assignment(name: str, seq: int, tmp_path: Path) -> None:
    config = CONFIGS / f"{name}.json"
    if name == "llama-mid":
        config = tmp_path / "llama-mid.json"
        config.write_text(json.dumps(LLAMA_MID))
    sizes = _torch_buckets(config)
    profile = paraplan.model_profile(str(config), seq_len=seq, precision="fp32")
    got = ddp_last_bucket_bytes(profile.layers, 4.0)
    assert sum(sizes) == pytest.approx(sum(x.params for x in profile.layers) * 4.0)
    # the traced tensor sizes, filled as torch fills them (one bucket under 1 MiB)
    assert got == pytest.approx(sizes[-1], rel=0.01), (got, sizes)
    assert len(sizes) == 1 or got < sum(sizes) / 1.5  # the early buckets overlap backward
