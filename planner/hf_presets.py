"""Hugging Face config presets (plain data, no torch): the models `--model NAME` traces.
Architecture sources are cited with the analytic presets in `model_spec.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Config kwargs of the presets (architecture papers cited in planner/model_spec.py).
_LLAMA3 = {
    "model_type": "llama",
    "vocab_size": 128256,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
HF_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2"},
    "gpt2-xl": {"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25},
    "llama3-8b": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "llama3-70b": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
    },
    "llama3-405b": {
        **_LLAMA3,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
}


def is_hf_model(source: str) -> bool:
    """Whether `--model` names a Hugging Face preset or config.json (vs an analytic spec)."""
    if source.lower() in HF_PRESETS:
        return True
    path = Path(source)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            return False
        return isinstance(data, dict) and "model_type" in data
    return False
