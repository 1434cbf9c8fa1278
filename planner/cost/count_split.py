"""A trainer's own split of the blocks over pipeline chunks, by count (`CountSplit`):
Megatron-Core's rules and layouts, and torchtitan's module lists and automatic split.

paraplan's own plans cut the stages by cost (`layout.balanced_cuts`) and write the cut as
`--pipeline-model-parallel-layout`; a Megatron configuration that gives no layout splits by
count, and a configuration is priced as it runs (`paraplan plan --from-config`). Megatron-Core
(`transformer_block.get_num_layers_to_build`, 0.16) splits the `num_layers` blocks:

- with `--pipeline-model-parallel-layout`, as the layout says, chunk by chunk;
- with `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`, those on
  the first / last pipeline rank and the rest evenly over the ranks between (which must
  divide them);
- otherwise evenly over the pipeline ranks, counting the embedding and the loss as one block
  each where `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-
  split` say so (the count must divide), the first (last) chunk then building one block less.

With v virtual stages a rank's blocks are split evenly over its v chunks (which must divide
them), and model chunk c runs on rank c mod pp as virtual stage c // pp. torchtitan (0.3) runs
the chunks its `module_fqns_per_model_part` lists, else its own automatic split (`weighted`).
`tests/test_count_split.py` checks every rule against megatron-core's and torchtitan's own
functions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class CountSplit:
    """How a trainer splits the blocks over the chunks when its configuration says so by count."""

    chunk_blocks: tuple[int, ...] = ()
    """Blocks of each chunk in model order, from a `--pipeline-model-parallel-layout` or
    torchtitan's module lists (empty: none given; then the fields below)."""
    first_stage_blocks: int | None = None
    """`--decoder-first-pipeline-num-layers`: blocks on the first pipeline rank."""
    last_stage_blocks: int | None = None
    """`--decoder-last-pipeline-num-layers`: blocks on the last pipeline rank."""
    embedding_as_layer: bool = False
    """`--account-for-embedding-in-pipeline-split`: the embedding counts as a block."""
    loss_as_layer: bool = False
    """`--account-for-loss-in-pipeline-split`: the loss counts as a block."""
    layers_per_stage: int | None = None
    """torchtitan's `pipeline_parallel_layers_per_stage`: with `weighted`, the chunk count is
    the weighted total over it, rounded up (`virtual_stages`)."""
    weighted: tuple[int, int] | None = None
    """torchtitan's automatic split instead (`pipeline_parallel._generate_llm_fqn_per_model_part`,
    0.3): the embedding and the head weigh this many blocks each (`pipeline_parallel_first/
    last_stage_less_layers`, 1 and 1 by default), the weighted total spread evenly over the
    chunks, the first chunks one more where it does not divide."""

    @staticmethod
    def of_modules(parts: object) -> CountSplit | None:
        """The split of torchtitan's `module_fqns_per_model_part` (module names per chunk in
        model order): its blocks ("layers.N") per chunk; None where it is not given."""
        if not isinstance(parts, list) or not parts:
            return None
        blocks = (sum(str(n).startswith("layers.") for n in part) for part in parts)
        return CountSplit(chunk_blocks=tuple(blocks))

    @staticmethod
    def of_torchtitan(parallelism: dict[str, object]) -> CountSplit:
        """How torchtitan splits the blocks under its `[parallelism]` settings: the chunks it
        lists, else its automatic split with the embedding's and head's weights."""
        listed = CountSplit.of_modules(parallelism.get("module_fqns_per_model_part"))
        weights = []
        for side in ("first", "last"):
            key = f"pipeline_parallel_{side}_stage_less_layers"
            value = parallelism.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} = {value!r}: give a whole number of blocks, 0 or more")
            weights.append(value)
        per = parallelism.get("pipeline_parallel_layers_per_stage")
        if per is not None and (isinstance(per, bool) or not isinstance(per, int) or per < 1):
            raise ValueError(
                f"pipeline_parallel_layers_per_stage = {per!r}: give a whole number of blocks, "
                "1 or more"
            )
        return listed or CountSplit(weighted=(weights[0], weights[1]), layers_per_stage=per)

    def virtual_stages(self, num_blocks: int, pp: int, *, looped: bool) -> int | None:
        """Chunks per pipeline rank torchtitan builds from `layers_per_stage` (None without
        it): the weighted total over it, rounded up, shared by the pp ranks (ValueError where
        torchtitan refuses: a count pp does not divide, or not 1 per rank for a single-stage
        schedule, or fewer than 2 for a looped one)."""
        if self.weighted is None or self.layers_per_stage is None:
            return None
        total = num_blocks + sum(self.weighted)
        chunks = -(-total // self.layers_per_stage)
        per_rank, spare = divmod(chunks, pp)
        if spare or (per_rank != 1 if not looped else per_rank < 2):
            want = "at least 2 stages per rank" if looped else "1 stage per rank"
            raise ValueError(
                f"pipeline_parallel_layers_per_stage {self.layers_per_stage} makes {chunks} "
                f"stages of {num_blocks} blocks over {pp} pipeline ranks; the schedule needs "
                f"{want} (torchtitan refuses it): change pipeline_parallel_layers_per_stage"
            )
        return per_rank

    def describe(self) -> str:
        """The split in words (for notes and messages)."""
        if self.weighted is not None:
            first, last = self.weighted
            per = self.layers_per_stage
            return f"torchtitan's split (the embedding and head weighing {first} and {last}" + (
                f", {per} layers per stage)" if per else ")"
            )
        if self.chunk_blocks:
            return "the layout's blocks per chunk " + ",".join(map(str, self.chunk_blocks))
        parts = []
        if self.first_stage_blocks is not None:
            parts.append(f"{self.first_stage_blocks} blocks on the first stage")
        if self.last_stage_blocks is not None:
            parts.append(f"{self.last_stage_blocks} on the last")
        if self.embedding_as_layer:
            parts.append("the embedding counted as a block")
        if self.loss_as_layer:
            parts.append("the loss counted as a block")
        return "Megatron's even split" + (f" ({', '.join(parts)})" if parts else "")

    def counts(self, num_blocks: int, pp: int, v: int, *, mtp: int = 0) -> list[int]:
        """Blocks of each of the pp x v chunks in model order, the `mtp` multi-token-prediction
        modules in the last chunk with the loss (Megatron-Core's place for them: a layout's
        "m", outside `num_blocks`). Raises ValueError (naming the numbers and the fix) where
        Megatron-Core refuses the split, or where a chunk would hold no block (paraplan prices
        chunks of one block or more)."""
        n = pp * v
        if self.weighted is not None:
            counts = _torchtitan_counts(num_blocks, n, *self.weighted)
        elif self.chunk_blocks:
            if len(self.chunk_blocks) != n or sum(self.chunk_blocks) != num_blocks:
                raise ValueError(
                    f"the pipeline layout has {len(self.chunk_blocks)} chunks of "
                    f"{sum(self.chunk_blocks)} blocks; the plan needs pp x virtual stages = "
                    f"{n} chunks of the model's {num_blocks}: fix the layout"
                )
            counts = list(self.chunk_blocks)
        else:
            per_rank = self._per_rank(num_blocks, pp)
            counts = []
            for c in range(n):
                rank = per_rank[c % pp]
                if rank % v:
                    raise ValueError(
                        f"{rank} blocks on pipeline rank {c % pp} do not divide into {v} virtual "
                        "stages (Megatron-Core requires it): change the virtual stages or give "
                        "a --pipeline-model-parallel-layout"
                    )
                counts.append(rank // v)
            if self.embedding_as_layer:
                counts[0] -= 1
            if self.loss_as_layer:
                counts[-1] -= 1
        counts[-1] += mtp
        if min(counts) < 1:
            raise ValueError(
                f"the split leaves a pipeline chunk without a block ({self.describe()}, "
                f"{pp} stages x {v} virtual stages): paraplan prices chunks of one block or "
                "more; use fewer stages"
            )
        return counts

    def _per_rank(self, num_blocks: int, pp: int) -> list[int]:
        """Blocks (and counted embedding/loss) on each pipeline rank."""
        first, last = self.first_stage_blocks, self.last_stage_blocks
        if first is None and last is None:
            total = num_blocks + int(self.embedding_as_layer) + int(self.loss_as_layer)
            if total % pp:
                raise ValueError(
                    f"{total} layers ({num_blocks} blocks"
                    + (" + the embedding" if self.embedding_as_layer else "")
                    + (" + the loss" if self.loss_as_layer else "")
                    + f") do not divide over {pp} pipeline stages (Megatron-Core requires it): "
                    "give --decoder-first/last-pipeline-num-layers or a "
                    "--pipeline-model-parallel-layout"
                )
            return [total // pp] * pp
        if self.embedding_as_layer or self.loss_as_layer:
            raise ValueError(
                "--decoder-first/last-pipeline-num-layers with --account-for-embedding/loss-in-"
                "pipeline-split: Megatron-Core refuses the two together; give one of them"
            )
        rest, ranks = num_blocks, pp
        for given in (first, last):
            if given is not None:
                rest, ranks = rest - given, ranks - 1
        if rest < 0 or (ranks > 0 and rest % ranks) or (ranks == 0 and rest):
            raise ValueError(
                f"{num_blocks} blocks less {first or 0} on the first and {last or 0} on the last "
                f"stage leave {rest} for the {ranks} stages between, not an even share "
                "(Megatron-Core requires one): change the first/last counts"
            )
        middle = rest // ranks if ranks else 0
        per_rank = [middle] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        return per_rank


def _torchtitan_counts(num_blocks: int, n: int, first: int, last: int) -> list[int]:
    """torchtitan 0.3's automatic split of `num_blocks` over `n` chunks, the embedding weighing
    `first` blocks and the head `last` (ValueError where torchtitan refuses it)."""
    total = num_blocks + first + last
    per, extra = divmod(total, n)
    if per == 0 or first > per or last > per:
        raise ValueError(
            f"torchtitan's split of {num_blocks} blocks (the embedding and head weighing {first} "
            f"and {last}) over {n} pipeline chunks leaves a chunk without its share (torchtitan "
            "refuses it): use fewer stages or give module_fqns_per_model_part"
        )
    counts, left = [], num_blocks
    for c in range(n):  # the shares add up to num_blocks: what is left is never short
        share = per + (c < extra) - (first if c == 0 else last if c == n - 1 else 0)
        counts.append(min(share, left))
        left -= counts[-1]
    return counts
