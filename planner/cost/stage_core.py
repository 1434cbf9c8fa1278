"""The part of a pipeline stage's seconds that no ZeRO stage, offload or compression choice
changes: compute, recompute and the TP, CP, EP and pipeline communication per micro-batch.

`Evaluator.stage_times` adds the data-parallel traffic, the offload copies and the optimizer
step to it; the search bounds a whole family of strategies by it alone
(`planner/search_bounds.py`), since those added terms are never negative.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Precision, RecomputeModule, SelectiveRecompute, TrainConfig
from ..strategy import Recompute, Schedule, Strategy
from .comm import Collectives, Links
from .compute import ATTENTION_BACKWARD_FACTOR
from .data_parallel import hidden_behind
from .layout import Layout, Stage, p2p_sends
from .mixed_precision import autocasts, residual_widening
from .per_layer import PerLayerRecompute
from .routing import routing_of
from .stage_parts import StageCompute
from .stages import StageModel

LOSS_ALL_REDUCES = 3
"""All-reduces a vocabulary-parallel cross-entropy runs per micro-batch, forward only (its
backward is local): counted on torch's `loss_parallel` in `tests/test_loss_parallel_comm.py`."""
LOSS_VALUE_BYTES = 4
"""Bytes per token of each: one fp32 value (the loss runs in fp32)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCore:
    """One distinct stage's seconds per micro-batch before the data-parallel terms."""

    stage: Stage
    """The stage (the first of those that look exactly like it)."""
    compute: StageCompute
    """Its compute per micro-batch."""
    recompute_s: float
    """Recomputation per micro-batch under the strategy's policy."""
    comm_s: float
    """Exposed TP, CP, EP and pipeline communication per micro-batch."""

    @property
    def per_microbatch_s(self) -> float:
        """Forward, backward, recompute and this communication: a slot without ZeRO's share."""
        return self.compute.fwd_s + self.compute.bwd_s + self.recompute_s + self.comm_s


def stage_core(
    s: Strategy,
    links: Links,
    coll: Collectives,
    sm: StageModel,
    per_layer: PerLayerRecompute,
    train: TrainConfig,
    contention: float,
    lay: Layout | None = None,
) -> tuple[StageCore, ...]:
    """`StageCore` of each distinct pipeline stage (`StageModel.stages`) of `s`. Of `links`
    it reads only the TP and EP links and whether the CP and PP groups span nodes
    (`Evaluator.stage_core` memoizes on those)."""
    p = sm.profile
    mbs = s.micro_batch_size
    lay = sm.layout_of(s) if lay is None else lay  # another: the bounds' merged stages
    compute = sm.stage_compute(lay, s.tp, s.cp, s.ep_dp, mbs)
    tokens = mbs * p.seq_len / s.cp
    act = mbs * sm.block_output_seq_bytes / s.cp  # one micro-batch's (b, s/cp, h) tensor
    tp = _tp_units(s, links, coll, sm, train, act)
    # Ring attention (Liu et al. 2023; torch's context_parallel): K and V of the local
    # chunk (GQA: kv_heads, each TP rank its share) travel cp-1 hops per block forward;
    # backward sends them again with their gradients.
    kv_shard = max(1, min(s.tp, p.kv_heads))
    kv_bytes = 2 * tokens * p.kv_dim / kv_shard * train.act_bytes
    hop_s = coll.p2p(kv_bytes, links.cp.nodes > 1) if s.cp > 1 else 0.0
    token_bytes = act / (s.tp if s.sequence_parallel else 1)  # each rank's tokens, once
    a2a = coll.dispatch(token_bytes, routing_of(p, train), links.ep) if s.ep > 1 else 0.0
    p2p = coll.p2p(sm.boundary_bytes(s) * tp.wide, links.pp.nodes > 1) if s.pp > 1 else 0.0
    ep_overlap = train.runtime.ep_comm_overlap and ep_overlap_applies(
        s, sm.num_microbatches(s), train.precision, train.mtp_layers
    )
    moe_layer_redone = (
        train.runtime.selective == SelectiveRecompute.ATTENTION_CORE
        and RecomputeModule.MOE in train.runtime.recompute_modules
    )
    out = []
    for c, stage in zip(compute, sm.stages(lay), strict=True):
        redo = per_layer.stage_recompute(s, stage, c)
        rc, n_full, n_full_moe = redo.seconds, redo.full_blocks, redo.full_moe_blocks
        # Megatron-Core's `moe` module: each selectively recomputed MoE layer runs again,
        # its TP collectives (unless folded) and its dispatch and combine
        n_moe_redone = redo.selective_moe_blocks if moe_layer_redone else 0
        # TP: 2 collectives per block forward and 2 backward (Narayanan et al. 2021 §3.2,
        # Korthikanti §4.2.2 with SP: all-gather + reduce-scatter), redone when recomputed.
        fwd_units = stage.n_blocks * 2 + n_full * 2 + n_moe_redone  # forward, and again
        edges = int(stage.has_embedding) + int(stage.has_head)
        units = stage.n_blocks * 2 + edges
        if s.folded_experts:
            # Experts folded over TP (Megatron-Core's expert_tensor_parallel_size 1 under SP):
            # each TP rank dispatches its own sequence shard to the experts, so a MoE block's
            # MLP has no TP all-gather and reduce-scatter, only its attention's.
            fwd_units -= stage.n_moe_blocks + n_full_moe + n_moe_redone
            units -= stage.n_moe_blocks
        comm = fwd_units * tp.fwd_s + units * tp.pair_s if s.tp > 1 else 0.0
        if s.tp > 1 and not tp.uniform:
            comm = fwd_units * tp.fwd_s + (units - edges) * tp.bwd_s + edges * tp.edge_s
        budget = c.fwd_s + c.bwd_s  # compute left to hide communication under
        if train.runtime.tp_comm_overlap and links.tp.nodes == 1:
            # Megatron's --tp-comm-overlap (Transformer Engine userbuffers; Wang et al. 2023
            # decomposition): each collective is split and pipelined with the GEMM it feeds,
            # so it hides under the stage's compute, which it slows (contention). Userbuffers
            # exchange over NVLink (CUDA IPC within the node): a TP group spanning nodes
            # runs its collectives on the critical path.
            budget -= min(comm, budget)
            comm = hidden_behind(comm, c.fwd_s + c.bwd_s, contention)
        if s.tp > 1 and stage.has_head:
            # The vocabulary-parallel cross-entropy on the rank's vocabulary shard: the
            # logits' maximum, the sum of their exponentials and the target's logit each
            # all-reduced over TP, one fp32 value per token (torch's `loss_parallel`, the
            # executor's and torchtitan's: torch/distributed/tensor/parallel/loss.py; Megatron-
            # Core's `_VocabParallelCrossEntropy` likewise), waited on before the loss
            comm += LOSS_ALL_REDUCES * coll.all_reduce(tokens * LOSS_VALUE_BYTES, links.tp)
        if s.cp > 1 and stage.n_blocks:
            # Each of the cp ring steps computes one (s/cp)^2 block of attention, balanced
            # by the causal load-balanced split (zig-zag chunks), while the next K/V hop is
            # in flight: a hop hides only under one step's attention, with contention.
            attn_f = c.attention_fwd_s / stage.n_blocks  # one block's attention fwd
            step_f = attn_f / s.cp
            step_b = ATTENTION_BACKWARD_FACTOR * step_f
            per_block = (s.cp - 1) * hidden_behind(hop_s, step_f, contention)
            per_block += (s.cp - 1) * hidden_behind(2 * hop_s, step_b, contention)
            comm += stage.n_blocks * per_block
        # EP: dispatch and combine, forward and backward (Lepikhin et al. 2020)
        a2a_s = (stage.n_moe_blocks * 4 + (n_full_moe + n_moe_redone) * 2) * a2a
        if ep_overlap:
            # Megatron-Core's --overlap-moe-expert-parallel-comm: one micro-batch's forward
            # and another's backward run merged, each one's all-to-alls on their own stream
            # under the other's compute (what TP overlap left of it), slowing it (contention)
            a2a_s = hidden_behind(a2a_s, budget, contention)
        comm += a2a_s
        if s.pp > 1:  # activations forward and gradients backward, per chunk
            sends = p2p_sends(stage, s.pp * s.virtual_stages)
            if overlaps_p2p(s, train):
                # Megatron-Core's `overlap_p2p_comm`: each send and receive is posted before
                # the chunk that precedes its use and waited after it, so it runs under one
                # chunk's forward (activations) or backward (gradients), slowing it
                k = max(1, len(stage.chunks))
                comm += sends / 2 * hidden_behind(p2p, c.fwd_s / k, contention)
                comm += sends / 2 * hidden_behind(p2p, c.bwd_s / k, contention)
            else:
                comm += sends * p2p
        out.append(StageCore(stage=stage, compute=c, recompute_s=rc, comm_s=comm))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _TpUnits:
    """Seconds of a stage's tensor-parallel collectives per micro-batch, by kind of pair."""

    pair_s: float
    """A pair in the compute dtype (SP: an all-gather and a reduce-scatter; else an
    all-reduce): what every pair costs when `uniform`."""
    fwd_s: float
    """A block's forward pair."""
    bwd_s: float
    """A block's backward pair."""
    edge_s: float
    """The embedding's or the head's."""
    wide: float
    """How much wider than the compute dtype the activations are (`residual_widening`)."""
    uniform: bool
    """Whether the backward and edge pairs cost `pair_s` (then the sums keep their old
    form, bit for bit)."""


def _tp_units(
    s: Strategy, links: Links, coll: Collectives, sm: StageModel, train: TrainConfig, act: float
) -> _TpUnits:
    """The TP pairs of `s` on one micro-batch's activation of `act` bytes (compute dtype).

    - Under the executor's autocast the residual stream is fp32 (`residual_widening`): SP
      gathers the norms' fp32 outputs and scatters the matmuls' bf16 ones forward, the
      reverse backward; the embedding's and head's are fp32. Bounds price every member of a
      family alike, in the compute dtype (a lower bound).
    - torch's functional collectives move a sequence-sharded (b, s, h) tensor through dim 0:
      a reduce-scatter first copies its input into rank-major chunks, an all-gather copies
      its output back unless the micro-batch is one sequence (a view then:
      `_chunk_or_narrow_cat`, `_maybe_view_chunk_cat`, torch 2.13), each a read and a write
      of the whole tensor, priced where the layers are priced op by op (`SP_LAYOUT_PASSES`).
    - Under fp8 with SP the forward pair's all-gather is fp8: torchtitan's Float8 TP
      (`PrepareFloat8ModuleInput`) and Transformer Engine's SP layers cast the norm's output
      shard to fp8 and gather that, one byte per element."""
    wide = 1.0 if coll.bounds_placements else residual_widening(s, sm)
    hi = act * wide
    if not s.sequence_parallel:
        pair = coll.all_reduce(act, links.tp)
        if wide == 1.0:
            return _TpUnits(pair, pair, pair, pair, wide, True)
        wide_pair = coll.all_reduce(hi, links.tp)  # the norm output's gradient
        return _TpUnits(pair, pair, wide_pair, wide_pair, wide, False)

    def gather(n: float) -> float:
        return coll.all_gather(n, links.tp)

    def scatter(n: float) -> float:
        return coll.reduce_scatter(n, links.tp)

    pair = gather(act) + scatter(act)
    k = None if coll.bounds_placements else sm.op_by_op_kernels(sm.profile.layers[0])
    if k is None:  # a bound, or layers not priced op by op: no copies, and no widening
        fwd = pair  # (`residual_widening` is priced where the layers are)
        if train.precision == Precision.FP8:
            fwd = gather(act / train.act_bytes) + scatter(act)
        return _TpUnits(pair, fwd, pair, pair, wide, True)

    def scatter_copy(n: float) -> float:
        return k.stream_s(SP_LAYOUT_PASSES * n, n)

    def gather_copy(n: float) -> float:  # a view for one sequence
        return 0.0 if s.micro_batch_size == 1 else scatter_copy(n)

    gathered = act / train.act_bytes if train.precision == Precision.FP8 else hi
    fwd = gather(gathered) + gather_copy(gathered) + scatter(act) + scatter_copy(act)
    bwd = scatter(hi) + scatter_copy(hi) + gather(act) + gather_copy(act)
    edge = gather(hi) + gather_copy(hi) + scatter(hi) + scatter_copy(hi)
    return _TpUnits(pair, fwd, bwd, edge, wide, False)


SP_LAYOUT_PASSES = 2
"""Passes over the whole tensor of a layout copy around a sequence-parallel collective: one
read and one write (`torch.cat` of the chunks)."""


def overlaps_p2p(s: Strategy, train: TrainConfig) -> bool:
    """Whether `s`'s pipeline sends run under compute (`Runtime.pp_comm_overlap`): Megatron-Core
    overlaps them only in its interleaved schedule (Megatron-LM turns `overlap_p2p_comm` off
    for the others; they batch each send with its receive and wait)."""
    return (
        train.runtime.pp_comm_overlap
        and s.schedule == Schedule.INTERLEAVED_1F1B
        and s.virtual_stages > 1
    )


def ep_overlap_applies(
    s: Strategy, microbatches: int, precision: Precision, mtp_layers: int = 0
) -> bool:
    """Whether Megatron-Core overlaps `s`'s all-to-alls with another micro-batch's compute
    under `--overlap-moe-expert-parallel-comm` (its `TransformerConfig` refuses the rest):
    expert parallelism, two micro-batches or more to pair, no pipeline or an interleaved one,
    no full or per-block recompute, bf16 or fp16 compute (fp8 runs in bf16), and at most one
    multi-token-prediction module, then with a pipeline."""
    pipeline_ok = s.pp == 1 or (s.schedule == Schedule.INTERLEAVED_1F1B and s.virtual_stages > 1)
    recompute_ok = s.recompute in (Recompute.NONE, Recompute.SELECTIVE)
    mtp_ok = mtp_layers == 0 or (mtp_layers == 1 and s.pp > 1)
    return (
        mtp_ok
        and s.ep > 1
        and microbatches >= 2
        and pipeline_ok
        and recompute_ok
        and precision != Precision.FP32
    )


class StageCores:
    """`stage_core` memoized for one evaluator's collectives (`coll`, `lower_bound_coll`) and
    for `PlacementBound`s (by their `memo_key`): with a uniform recompute policy it depends on
    neither the ZeRO stage, the offloads, PowerSGD nor the mesh order (given the links), which
    the search varies most, but for whether the executor autocasts (FSDP2 casts instead)."""

    def __init__(
        self,
        sm: StageModel,
        per_layer: PerLayerRecompute,
        train: TrainConfig,
        contention: float,
        coll: Collectives,
        lower_bound_coll: Collectives,
    ) -> None:
        self.sm, self.per_layer, self.train, self.contention = sm, per_layer, train, contention
        self.coll = coll
        """The evaluator's collectives."""
        self.lower_bound_coll = lower_bound_coll
        """The evaluator's fastest-link collectives (bounds)."""
        self._found: dict[tuple, tuple[StageCore, ...]] = {}  # see `get`'s key

    def get(
        self, s: Strategy, links: Links, coll: Collectives, *, merged: bool = False
    ) -> tuple[StageCore, ...]:
        """`stage_core` of `s` under `links` and `coll`. With `merged` (for bounds, under a
        uniform recompute policy), a split backward's stages that look alike once: the layout
        without `Layout.per_stage`, whose stages' seconds equal those of the stages they stand
        for but for the rounding of sums over other positions of the chain (search_bounds.py)."""
        which = 0 if coll is self.coll else 1 if coll is self.lower_bound_coll else None
        which = getattr(coll, "memo_key", None) if which is None else which  # PlacementBound
        lay = self.sm.layout_of(s)
        lay = self.sm.layouts.merged(lay) if merged else lay
        if which is None:
            return self._cores(s, links, coll, lay)
        per_layer = s.recompute == Recompute.PER_LAYER  # its solution depends on all of them
        key = (
            s.dp,
            s.tp,
            s.pp,
            s.cp,
            s.ep,
            s.folded_experts,
            s.sequence_parallel,
            s.virtual_stages,
            s.micro_batch_size,
            s.recompute,
            lay,  # not the schedule: those of one layout share it (1F1B and ZB's merged, ...)
            overlaps_p2p(s, self.train),  # but whether its sends hide (interleaved 1F1B's)
            autocasts(s),  # and whether autocast widens its activations (`residual_widening`)
            s if per_layer else None,
            # all it reads of the links (mesh orders moving only dp groups share it)
            links.tp,
            links.cp.nodes > 1,
            links.ep,
            links.pp.nodes > 1,
            which,
        )
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = self._cores(s, links, coll, lay)
        return found

    def _cores(
        self, s: Strategy, links: Links, coll: Collectives, lay: Layout
    ) -> tuple[StageCore, ...]:
        return stage_core(s, links, coll, self.sm, self.per_layer, self.train, self.contention, lay)
