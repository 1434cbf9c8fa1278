"""Small real models the profiler tests run on: Hugging Face models built from config
classes (random weights, no hub) and two plain modules defined here."""

from __future__ import annotations

import os

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BATCH, SEQ = 2, 32

HF_TINY: dict[str, dict] = {
    # GPT-2 small itself (124M parameters), as Hugging Face ships it.
    "gpt2-small": {"model_type": "gpt2"},
    # GPT-2 as Hugging Face ships it (tanh GELU written out, dropout on), only smaller.
    "gpt2": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "vocab_size": 256,
        "n_positions": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "llama": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    },
    "bert": {
        "model_type": "bert",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    },
    "mixtral": {
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 64,
    },
}


class ResidualBlock(nn.Module):
    """A ResNet basic block; channel counts differ between blocks (a heterogeneous chain)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class TinyResNet(nn.Module):
    """Stem, four residual blocks of growing width, pooled linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.layers = nn.Sequential(
            ResidualBlock(16, 16, 1),
            ResidualBlock(16, 32, 2),
            ResidualBlock(32, 64, 2),
            ResidualBlock(64, 64, 1),
        )
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, classes)
        h = self.layers(self.stem(x))
        return self.fc(h.mean(dim=(2, 3)))


def mlp(width: int = 128, depth: int = 6) -> nn.Sequential:
    """A plain MLP: Linear/ReLU pairs in one Sequential."""
    mods: list[nn.Module] = []
    for _ in range(depth):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


def hf(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32, **overrides):
    """(model, inputs) for one of HF_TINY (config keys overridden by `overrides`)."""
    from paraplan.profiler.hf import build_model, example_inputs, load_config

    torch.manual_seed(0)
    cfg = load_config(HF_TINY[name] | overrides)
    return build_model(cfg, device=device, dtype=dtype), example_inputs(cfg, BATCH, SEQ, device)


def plain(name: str):
    """(model, inputs, loss_fn) for the CNN or the MLP."""
    torch.manual_seed(0)
    if name == "cnn":
        x = torch.randn(BATCH, 3, 16, 16)
        y = torch.randint(0, 10, (BATCH,))
        return TinyResNet(), (x,), lambda out: nn.functional.cross_entropy(out, y)
    x = torch.randn(BATCH * 4, 128)
    y = torch.randint(0, 10, (BATCH * 4,))
    return mlp(), (x,), lambda out: nn.functional.cross_entropy(out, y)
