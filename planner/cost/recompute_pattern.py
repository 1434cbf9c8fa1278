"""A trainer configuration's own choice of which blocks it fully recomputes (`RecomputePattern`):
priced as the trainer runs it, where paraplan's `per_layer` would solve for the least
recomputation that fits.

Two rules are read from trainers' configurations:

- torchtitan <= 0.2, ``[activation_checkpoint] mode = "selective"`` with an integer
  ``selective_ac_option = N`` (its default, "2"): `_apply_layer_sac`
  (torchtitan/distributed/activation_checkpoint.py, v0.2.0) wraps a block in a full checkpoint
  when a per-process counter of the blocks it has wrapped, starting at 1, is a multiple of N.
  Each pipeline rank builds its own chunks, in model order, so the count runs over the
  rank's blocks: every Nth block of each rank (`EVERY_NTH_OF_RANK`).
- Megatron-LM ``--recompute-granularity full --recompute-method block
  --recompute-num-layers k``: Megatron-Core's `TransformerBlock._checkpointed_forward` (0.16)
  checkpoints the first k layers of each `TransformerBlock`, one per pipeline chunk: the
  first k blocks of every chunk (`FIRST_OF_CHUNK`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..model import LayerKind, ModelProfile
from ..strategy import Recompute
from .layout import Chunk


class PatternRule(StrEnum):
    """How a trainer names the blocks it recomputes."""

    EVERY_NTH_OF_RANK = "every_nth_of_rank"
    """Every `count`-th block of each pipeline rank, counted from 1 over its chunks in model
    order (torchtitan <= 0.2's `selective_ac_option`)."""
    FIRST_OF_CHUNK = "first_of_chunk"
    """The first `count` blocks of every pipeline chunk (Megatron's `block` method)."""


@dataclass(frozen=True, slots=True)
class RecomputePattern:
    """Which blocks a trainer fully recomputes; the others keep their activations."""

    rule: PatternRule
    """How the blocks are named."""
    count: int
    """N of `EVERY_NTH_OF_RANK`, k of `FIRST_OF_CHUNK` (at least 1)."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"recompute pattern count {self.count} must be at least 1")

    def policies(self, profile: ModelProfile, chunks: tuple[Chunk, ...]) -> tuple[Recompute, ...]:
        """The policy of every chain layer of `profile` under `chunks` (the plan's pipeline
        chunks in model order, each naming the rank that runs it): FULL for the blocks the
        rule names, NONE for every other layer."""
        out = [Recompute.NONE] * len(profile.layers)
        seen: dict[int, int] = {}  # blocks counted so far on each rank
        for chunk in sorted(chunks, key=lambda c: c.index):
            in_chunk = 0
            for i in range(chunk.first_layer, chunk.last_layer + 1):
                if profile.layers[i].kind != LayerKind.BLOCK:
                    continue
                in_chunk += 1
                seen[chunk.stage] = seen.get(chunk.stage, 0) + 1
                if self.rule == PatternRule.FIRST_OF_CHUNK:
                    named = in_chunk <= self.count
                else:
                    named = seen[chunk.stage] % self.count == 0
                if named:
                    out[i] = Recompute.FULL
        return tuple(out)

    def describe(self) -> str:
        """The rule in words, e.g. "every 2nd block of each pipeline rank fully recomputed"."""
        if self.rule == PatternRule.FIRST_OF_CHUNK:
            blocks = "block" if self.count == 1 else f"{self.count} blocks"
            return f"the first {blocks} of every pipeline chunk fully recomputed"
        return f"every {_ordinal(self.count)} block of each pipeline rank fully recomputed"


def _ordinal(n: int) -> str:
    """2 -> "2nd", 3 -> "3rd", 11 -> "11th"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
