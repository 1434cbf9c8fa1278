"""A causal language model as the planner sees it: a chain of embedding, blocks and head.

The plan numbers the chain: index 0 is the embedding, 1..L the blocks, L+1 the head.
`ChainModule` holds the three parts under stable names (``embed``, ``blocks.<i>``, ``head``)
so that a pipeline chunk is the same class with some parts removed, and parameter names (FQNs)
do not depend on the plan (torchtitan keeps its layers in a ModuleDict for the same reason).
`convert.to_chain_module` converts a supported Hugging Face model in place (the parameters are
reused).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

TPPlanFn = Callable[[bool], dict[str, ParallelStyle]]
"""Sequence parallel on/off -> `parallelize_module` plan for ONE block (paths inside it)."""
HFNamesFn = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""Full tensors by chain name -> the same tensors by Hugging Face name and layout."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VocabPaths:
    """Paths of the vocabulary-sized modules inside a chain's embedding and head."""

    embedding: str
    """The token `nn.Embedding` inside `ChainModule.embed` (e.g. ``embed_tokens``)."""
    projection: str
    """The output `nn.Linear` inside `ChainModule.head` (e.g. ``lm_head``)."""


class ChainModule(nn.Module):
    """Embedding (chain index 0), blocks (1..L) and head (L+1); forward maps token ids
    (B, T) to logits (B, T, V). A pipeline chunk holds a contiguous part: `embed` or `head`
    may be None and `blocks` a subset (keys keep their block numbers)."""

    def __init__(
        self,
        embed: nn.Module | None,
        blocks: Sequence[nn.Module] | nn.ModuleDict,
        head: nn.Module | None,
        *,
        family: str = "custom",
        tp_plan: TPPlanFn | None = None,
        hf_names: HFNamesFn | None = None,
        vocab: VocabPaths | None = None,
    ) -> None:
        super().__init__()
        self.embed = embed
        if isinstance(blocks, nn.ModuleDict):
            self.blocks = blocks
        else:
            self.blocks = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.head = head
        self.family = family
        """Model family the chain was converted from (``gpt2``, ``llama``, ``custom``)."""
        self.tp_plan = tp_plan
        """The tensor-parallel plan of one block (None: TP unsupported unless given)."""
        self.hf_names = hf_names
        """Maps full tensors back to Hugging Face names (None for custom chains)."""
        self.tied: tuple[str, str] | None = None
        """(embedding param, head param) names when the head reuses the embedding matrix."""
        self.vocab = vocab
        """Where the vocabulary matrices are, for a vocab-parallel embedding and head (None:
        they stay whole on every tensor-parallel rank)."""

    @property
    def num_blocks(self) -> int:
        """Blocks held (all of them, or a pipeline chunk's)."""
        return len(self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V), or hidden states (B, T, H) for a chunk that
        lacks the embedding (input) or the head (output)."""
        h = self.embed(x) if self.embed is not None else x  # (B, T, H)
        for block in self.blocks.values():
            h = block(h)  # (B, T, H); (B, T/tp, H) between blocks under sequence parallel
        return self.head(h) if self.head is not None else h  # (B, T, V)

    def chunk(self, first_layer: int, last_layer: int) -> ChainModule:
        """The chain layers `first_layer..last_layer` (inclusive chain indices) as a new
        ChainModule sharing this one's modules (no copy)."""
        last_index = self.num_blocks + 1
        if not 0 <= first_layer <= last_layer <= last_index:
            raise ValueError(
                f"chain range {first_layer}..{last_layer} is outside 0..{last_index} "
                f"(embedding, {self.num_blocks} blocks, head); the plan was made for another "
                "model depth: re-plan for this model"
            )
        keys = [str(i - 1) for i in range(max(first_layer, 1), min(last_layer, last_index - 1) + 1)]
        part = ChainModule(
            self.embed if first_layer == 0 else None,
            nn.ModuleDict({k: self.blocks[k] for k in keys}),
            self.head if last_layer == last_index else None,
            family=self.family,
            tp_plan=self.tp_plan,
            hf_names=self.hf_names,
            vocab=self.vocab,
        )
        part.tied = self.tied
        return part


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (B, T, V) against target ids (B, T), in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
