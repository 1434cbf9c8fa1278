"""Pipeline layout: which chain layers each stage (and each interleaved chunk) runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import ModelProfile


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous range of chain layers run by one pipeline rank."""

    stage: int
    """Pipeline rank that runs it."""
    index: int
    """Position of the chunk in the model (0 .. pp*v-1)."""
    first_layer: int
    """First chain index (0 is the embedding)."""
    last_layer: int
    """Last chain index, inclusive."""


def block_counts(num_blocks: int, num_chunks: int) -> list[int]:
    """Blocks per chunk, as even as possible; spare blocks go to the chunks that hold neither
    the embedding nor the (costly) head first, then to the first, then the last chunk."""
    if num_chunks > num_blocks:
        raise ValueError(
            f"{num_chunks} pipeline chunks for {num_blocks} blocks: every chunk needs a block; "
            "reduce pp * virtual_stages"
        )
    base, spare = divmod(num_blocks, num_chunks)
    counts = [base] * num_chunks
    order = [*list(range(1, num_chunks - 1)), 0, num_chunks - 1]
    for i in order[:spare]:
        counts[i] += 1
    return counts


def pipeline_chunks(profile: ModelProfile, pp: int, virtual_stages: int) -> tuple[Chunk, ...]:
    """Chunks in model order; chunk c runs on stage c % pp (Narayanan et al. 2021 §2.2)."""
    num_chunks = pp * virtual_stages
    counts = block_counts(profile.num_blocks, num_chunks)
    chunks = []
    start = 1  # chain index 0 is the embedding, which joins the first chunk
    last_block = profile.num_blocks
    for c, count in enumerate(counts):
        first = 0 if c == 0 else start
        end = start + count - 1
        last = last_block + 1 if c == num_chunks - 1 else end  # the head joins the last chunk
        chunks.append(Chunk(stage=c % pp, index=c, first_layer=first, last_layer=last))
        start = end + 1
    return tuple(chunks)


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: its layers and per-sequence sums over them."""

    index: int
    """Stage index (the first of the stages that look exactly like this one)."""
    layers: tuple[int, ...]
    dense_params: float
    expert_params: float
    max_block_params: float
    max_block_expert_params: float
    n_blocks: int
    n_moe_blocks: int
    has_embedding: bool
    has_head: bool
    chunks: tuple[Chunk, ...]
