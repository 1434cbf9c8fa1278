"""A strategy's predicted step time, throughput, MFU and memory per GPU.

Each term names its source; docs/cost-model.md lists them all with their units.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from ..cluster import Cluster
from ..config import TrainConfig
from ..model import LayerKind, ModelProfile
from ..strategy import MeshAxis, Recompute, Strategy
from .comm import AxisLink, Collectives, link_of, merge_links, place_axes
from .data_parallel import dp_comm, optimizer_s
from .estimate import Estimate, TimeBreakdown
from .layout import Stage, pipeline_chunks
from .memory import (
    BUCKETS_IN_FLIGHT,
    DDP_BUCKET_BYTES,
    MemoryBreakdown,
    in_flight_microbatches,
    layer_act_bytes,
    model_state_bytes,
)
from .per_layer import PerLayerRecompute
from .rules import violation

Policy = Recompute | tuple[Recompute, ...]
"""A uniform recompute policy, or one policy per chain layer."""

ACT_IO_FACTOR = 2
"""A layer writes its saved activations in forward and reads them in backward (roofline)."""


class Evaluator:
    """Evaluates strategies for one model, cluster and training config (memoized)."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, train: TrainConfig) -> None:
        if profile.seq_len != train.seq_len:
            raise ValueError(
                f"the model profile is for seq_len={profile.seq_len} but training uses "
                f"seq_len={train.seq_len}; build the profile at the training sequence length"
            )
        self.profile, self.cluster, self.train = profile, cluster, train
        acc = cluster.accelerator
        self.acc = acc
        self.flops_per_s = acc.peak_flops_for(train.compute_dtype) * acc.matmul_efficiency
        self.capacity_bytes = acc.memory_bytes * (1.0 - train.memory_headroom)
        self.coll = Collectives(acc)
        self.model_flops_per_seq = sum(x.fwd_flops + x.bwd_flops for x in profile.layers)
        # A profile traced in one dtype planned in another: activations scale with the dtype.
        self.act_scale = train.act_bytes / profile.act_dtype_bytes
        blocks = [x for x in profile.layers if x.kind == LayerKind.BLOCK]
        # The (b, s, h) tensor a block passes on: pipeline p2p and TP collective messages.
        self.block_output_seq_bytes = max(x.output_bytes for x in blocks) * self.act_scale
        self.measured = (
            bool(profile.measured_on)
            and profile.measured_on == acc.name
            and all(x.fwd_time_s is not None and x.bwd_time_s is not None for x in profile.layers)
        )
        self._layer_keys = [
            (x.kind, x.params, x.expert_params, x.fwd_flops, x.bwd_flops, x.attn_core_fwd_flops,
             x.act_tp_bytes, x.act_replicated_bytes, x.act_attn_core_bytes, x.input_bytes)
            for x in profile.layers
        ]  # fmt: skip
        self.num_blocks = profile.num_blocks
        self._stages = cache(self._stages_uncached)
        self._compute = cache(self._compute_uncached)
        self._act_sums = cache(self._act_sums_uncached)
        self._act_prefix = cache(self._act_prefix_uncached)
        self._static_memory = cache(self._static_memory_uncached)
        self._layer_times = cache(self._layer_times_uncached)
        self._total_compute = cache(self._total_compute_uncached)
        self.per_layer = PerLayerRecompute(self)

    # ---- structure ------------------------------------------------------------------------
    def num_microbatches(self, s: Strategy) -> int:
        """Micro-batches per replica per step."""
        return self.train.global_batch // (s.dp * s.micro_batch_size)

    def violation(self, s: Strategy) -> str:
        """The first structural rule the strategy breaks ('' when none)."""
        return violation(s, self)

    def _stages_uncached(self, pp: int, v: int) -> tuple[Stage, ...]:
        """The distinct stages of a pp x v layout. Stages with identical layers and position
        (first/middle/last) cost the same, and in-flight micro-batches never grow with the
        stage index, so the first of each kind bounds the others: only it is kept."""
        p = self.profile
        chunks = pipeline_chunks(p, pp, v)
        stages: list[Stage] = []
        seen: set[tuple] = set()
        for st in range(pp):
            mine = tuple(c for c in chunks if c.stage == st)
            idx = tuple(i for c in mine for i in range(c.first_layer, c.last_layer + 1))
            signature = (tuple(self._layer_keys[i] for i in idx), st == 0, st == pp - 1)
            if signature in seen:
                continue
            seen.add(signature)
            layers = [p.layers[i] for i in idx]
            blocks = [x for x in layers if x.kind == LayerKind.BLOCK]
            dense = float(sum(x.params for x in layers))
            has_head = any(x.kind == LayerKind.HEAD for x in layers)
            has_emb = any(x.kind == LayerKind.EMBEDDING for x in layers)
            if has_head and p.tied_embeddings and not has_emb:
                dense += p.vocab * p.hidden  # the tied embedding's copy on the last stage
            stages.append(
                Stage(
                    index=st,
                    layers=idx,
                    dense_params=dense,
                    expert_params=float(sum(x.expert_params for x in layers)),
                    max_block_params=float(max((x.params for x in blocks), default=0)),
                    max_block_expert_params=float(
                        max((x.expert_params for x in blocks), default=0)
                    ),
                    n_blocks=len(blocks),
                    n_moe_blocks=sum(1 for x in blocks if x.expert_params),
                    has_embedding=has_emb,
                    has_head=has_head,
                    chunks=mine,
                )
            )
        return tuple(stages)

    # ---- per-layer recompute (cost/per_layer.py) ---------------------------------------------
    def recompute_saved_bytes(self, s: Strategy) -> float:
        """Peak memory per GPU the strategy's recompute saves against recomputing nothing."""
        if s.recompute == Recompute.NONE:
            return 0.0
        plain = self.memory(replace(s, recompute=Recompute.NONE))[0].total_bytes
        return max(0.0, plain - self.memory(s)[0].total_bytes)

    def _policy(self, s: Strategy) -> Policy:
        """The cache key of the strategy's activation policy."""
        return s.recompute if s.recompute != Recompute.PER_LAYER else self.per_layer.policies(s)

    # ---- memory ---------------------------------------------------------------------------
    def memory(self, s: Strategy) -> tuple[MemoryBreakdown, int]:
        """Peak memory breakdown over the pipeline stages, and the stage that peaks."""
        acts = self._act_sums(s.pp, s.virtual_stages, s.tp, s.sequence_parallel, s.cp,
                              self._policy(s))  # fmt: skip
        stages = self._stages(s.pp, s.virtual_stages)
        mems = [self._stage_memory(s, st, *acts[i]) for i, st in enumerate(stages)]
        if self._single_pass(s):
            mems = [self._backward_timeline(s, mems[0])]
        peak = max(range(len(mems)), key=lambda i: mems[i].total_bytes)
        return mems[peak], stages[peak].index

    def _single_pass(self, s: Strategy) -> bool:
        """One micro-batch, no pipeline, unsharded gradients: the gradients then grow while
        the activations are freed, layer by layer, instead of coexisting whole."""
        return s.pp == 1 and s.zero_stage < 2 and self.num_microbatches(s) == 1

    def _backward_timeline(self, s: Strategy, mem: MemoryBreakdown) -> MemoryBreakdown:
        """Peak over the backward pass, which runs from the head to the embedding: at layer i
        the gradients of layers >= i exist and the activations of layers <= i, plus layer i's
        transient (profiled peak, or its re-materialization under full recompute)."""
        p, t, mbs = self.profile, self.train, s.micro_batch_size
        prefix, back, tmp = self._act_prefix(s.tp, s.sequence_parallel, s.cp, self._policy(s))
        grads = 0.0
        best = (-1.0, 0.0, 0.0)
        for i in reversed(range(len(p.layers))):
            x = p.layers[i]
            grads += (x.params / s.tp + x.expert_params / (s.tp * s.ep)) * t.grad_bytes
            acts = (prefix[i + 1] + max(tmp[i], back[i])) * mbs
            if grads + acts > best[0]:
                best = (grads + acts, grads, acts)
        return replace(mem, grads_bytes=best[1], activations_bytes=best[2])

    def _act_sums_uncached(
        self, pp: int, v: int, tp: int, sp: bool, cp: int, recompute: Policy
    ) -> tuple[tuple[float, float], ...]:
        """Per stage: (activation bytes kept per sequence, transient bytes per sequence).

        The transient is the largest of the layers' profiled forward/backward peaks and, under
        full recompute, what re-materializing one block adds back on top of the kept inputs
        (less its own input, already kept), after the head's backward has freed the head's
        activations (Korthikanti et al. 2022 §5)."""
        prefix, back, tmp = self._act_prefix(tp, sp, cp, recompute)
        out = []
        for stage in self._stages(pp, v):
            per_seq = sum(prefix[c.last_layer + 1] - prefix[c.first_layer] for c in stage.chunks)
            spans = [(c.first_layer, c.last_layer + 1) for c in stage.chunks]
            worst = max(max(back[a:b]) for a, b in spans)
            if stage.has_head:
                worst -= prefix[len(prefix) - 1] - prefix[len(prefix) - 2]
            out.append((per_seq, max(0.0, worst, max(max(tmp[a:b]) for a, b in spans))))
        return tuple(out)

    def _act_prefix_uncached(
        self, tp: int, sp: bool, cp: int, recompute: Policy
    ) -> tuple[list[float], list[float], list[float]]:
        """Per chain layer, per sequence, in the training dtype: prefix sums of the bytes kept
        under `recompute` (uniform, or one policy per layer); what recomputing each fully
        recomputed block adds back (its bytes without recompute less what full recompute
        keeps; 0 for other layers); its transient peak."""
        prefix = [0.0]
        back, tmp = [], []
        k = self.act_scale
        layers = self.profile.layers
        policies = (
            self.per_layer.uniform(recompute) if isinstance(recompute, Recompute) else recompute
        )
        for x, policy in zip(layers, policies, strict=True):
            kept = layer_act_bytes(x, tp=tp, sp=sp, cp=cp, recompute=policy)
            prefix.append(prefix[-1] + kept * k)
            if x.kind == LayerKind.BLOCK and policy == Recompute.FULL:
                none = layer_act_bytes(x, tp=tp, sp=sp, cp=cp, recompute=Recompute.NONE)
                full = layer_act_bytes(x, tp=tp, sp=sp, cp=cp, recompute=Recompute.FULL)
                back.append((none - full) * k)
            else:
                back.append(0.0)
            tmp.append(max(x.fwd_tmp_bytes, x.bwd_tmp_bytes) * k / (tp * cp))
        return prefix, back, tmp

    def _stage_memory(
        self, s: Strategy, stage: Stage, per_seq: float, worst_block: float
    ) -> MemoryBreakdown:
        params, grads, optimizer, other = self._static_memory(
            stage, s.tp, s.ep, s.dp * s.cp, s.zero_stage, s.offload_optimizer
        )
        inflight = in_flight_microbatches(
            s.schedule,
            pp=s.pp,
            stage=stage.index,
            num_microbatches=self.num_microbatches(s),
            virtual_stages=s.virtual_stages,
        )
        acts = (per_seq * inflight + worst_block) * s.micro_batch_size
        if s.pp > 1:
            boundary = self._boundary_bytes(s)
            other += 2 * s.virtual_stages * boundary  # send and receive buffers per chunk
        return MemoryBreakdown(
            params_bytes=params,
            grads_bytes=grads,
            optimizer_bytes=optimizer,
            activations_bytes=acts,
            other_bytes=other,
        )

    def memory_totals(
        self, s: Strategy, choices: tuple[tuple[bool, int, bool, Recompute], ...]
    ) -> list[float | None]:
        """Peak memory (`memory(...)[0].total_bytes`) of `s` under each (sp, zero, offload,
        recompute) choice, computed together: the search's fast path. A `per_layer` choice
        is None (left to the caller, as it needs the recompute solver) unless `none` fits with
        the same sharding, which makes it that strategy."""
        m, mbs, v = self.num_microbatches(s), s.micro_batch_size, s.virtual_stages
        stages = self._stages(s.pp, v)
        dpcp = s.dp * s.cp
        inflight = [
            in_flight_microbatches(
                s.schedule, pp=s.pp, stage=st.index, num_microbatches=m, virtual_stages=v
            )
            for st in stages
        ]
        static: dict[tuple[int, bool], list[float]] = {}
        acts: dict[tuple[bool, Recompute], list[float]] = {}
        none_totals: dict[tuple[bool, int, bool], float] = {}
        out: list[float | None] = []
        for sp, zero, off, rc in choices:
            if (zero, off) not in static:
                static[(zero, off)] = [
                    sum(self._static_memory(st, s.tp, s.ep, dpcp, zero, off)) for st in stages
                ]
            if (sp, rc) not in acts and rc != Recompute.PER_LAYER:
                sums = self._act_sums(s.pp, v, s.tp, sp, s.cp, rc)
                boundary = 0.0
                if s.pp > 1:
                    boundary = 2 * v * self._boundary_bytes(s, sp)
                acts[(sp, rc)] = [
                    (per_seq * inflight[i] + transient) * mbs + boundary
                    for i, (per_seq, transient) in enumerate(sums)
                ]
            plain = none_totals.get((sp, zero, off))
            if rc == Recompute.PER_LAYER and plain is not None and plain <= self.capacity_bytes:
                # `none` fits: the solver keeps everything, so this is that strategy (or one
                # recomputing more where `none` fits only by the single-pass timeline).
                out.append(plain)
                continue
            if rc == Recompute.PER_LAYER:
                out.append(None)
                continue
            if self._single_pass(s) and zero < 2:
                choice = replace(s, sequence_parallel=sp, zero_stage=zero,
                                 offload_optimizer=off, recompute=rc)  # fmt: skip
                total = self.memory(choice)[0].total_bytes
            else:
                total = max(x + y for x, y in zip(static[(zero, off)], acts[(sp, rc)], strict=True))
            if rc == Recompute.NONE:
                none_totals[(sp, zero, off)] = total
            out.append(total)
        return out

    def _static_memory_uncached(
        self, stage: Stage, tp: int, ep: int, dpcp: int, zero: int, offload: bool
    ) -> tuple[float, float, float, float]:
        """(params, grads, optimizer, other) bytes of a stage: what does not scale with the
        micro-batch. Experts shard over the expert-data-parallel group (dp*cp/ep)."""
        t = self.train
        states = [0.0, 0.0, 0.0]
        dense_rank = stage.dense_params / tp
        expert_rank = stage.expert_params / (tp * ep)
        for count, ranks in ((dense_rank, dpcp), (expert_rank, dpcp // ep)):
            if count:
                part = model_state_bytes(
                    count, shard_ranks=ranks, zero_stage=zero, train=t, offload_optimizer=offload
                )
                states = [x + y for x, y in zip(states, part, strict=True)]
        other = float(self.acc.runtime_overhead_bytes)
        if zero == 3 and dpcp > 1:
            # FSDP keeps the current and the prefetched block unsharded, plus one block's
            # unsharded gradients before reduce-scatter (Zhao et al. 2023, PyTorch FSDP §3.2).
            block = stage.max_block_params / tp + stage.max_block_expert_params / (tp * ep)
            other += block * (2 * t.param_bytes + t.grad_bytes)
        elif dpcp > 1:
            other += BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES
        return states[0], states[1], states[2], other

    def _boundary_bytes(self, s: Strategy, sp: bool | None = None) -> float:
        """Bytes of one micro-batch's activation crossing a stage boundary (per rank), with
        sequence parallelism `sp` (default: the strategy's)."""
        sp = s.sequence_parallel if sp is None else sp
        div = s.cp * (s.tp if sp else 1)
        return s.micro_batch_size * self.block_output_seq_bytes / div

    # ---- time -----------------------------------------------------------------------------
    def _roofline_s(self, flops: float, nbytes: float) -> float:
        """max(compute-bound, memory-bound) time: the roofline (Williams et al. 2009)."""
        return max(flops / self.flops_per_s, nbytes / self.acc.memory_bw_bytes_per_s)

    def _layer_times_uncached(
        self, tp: int, cp: int, ep: int, mbs: int
    ) -> tuple[list[float], list[float], list[float], list[float]]:
        """Prefix sums over the chain of per-micro-batch (forward, backward, full-recompute,
        selective-recompute) seconds of each layer on one rank."""
        p, t = self.profile, self.train
        sums: tuple[list[float], ...] = ([0.0], [0.0], [0.0], [0.0])
        for x in p.layers:
            weights = (x.params / tp + x.expert_params / (tp * ep)) * t.param_bytes
            acts = ACT_IO_FACTOR * mbs * (x.act_tp_bytes / tp + x.act_replicated_bytes) / cp
            acts *= self.act_scale
            # Matmuls on the roofline, plus the memory-bound elementwise kernels (norms,
            # activations, softmax, residuals) streaming the activations they save.
            elementwise = acts / self.acc.memory_bw_bytes_per_s
            if self.measured:  # profiled on this accelerator: measured seconds, split ideally
                f = x.fwd_time_s * mbs / (tp * cp)  # type: ignore[operator]
                b = x.bwd_time_s * mbs / (tp * cp)  # type: ignore[operator]
            else:
                f = self._roofline_s(x.fwd_flops * mbs / (tp * cp), weights) + elementwise
                b = self._roofline_s(x.bwd_flops * mbs / (tp * cp), 2 * weights) + elementwise
            block = x.kind == LayerKind.BLOCK
            sel = x.attn_core_fwd_flops * mbs / (tp * cp) / self.flops_per_s if block else 0.0
            for acc, val in zip(sums, (f, b, f if block else 0.0, sel), strict=True):
                acc.append(acc[-1] + val)
        return sums  # type: ignore[return-value]

    def _compute_uncached(
        self, pp: int, v: int, tp: int, cp: int, ep: int, mbs: int
    ) -> tuple[tuple[float, float, float, float], ...]:
        """Per stage, per micro-batch: (forward, backward, full-recompute, selective) seconds."""
        sums = self._layer_times(tp, cp, ep, mbs)
        out = []
        for stage in self._stages(pp, v):
            totals = [0.0, 0.0, 0.0, 0.0]
            for c in stage.chunks:
                for k in range(4):
                    totals[k] += sums[k][c.last_layer + 1] - sums[k][c.first_layer]
            out.append((totals[0], totals[1], totals[2], totals[3]))
        return tuple(out)

    def compute_lower_bound_s(self, s: Strategy) -> float:
        """A bound no layout, schedule, ZeRO stage, recompute policy or mesh order beats for
        these degrees and micro-batch size: the pipeline's busiest stage does at least 1/pp of
        the forward and backward compute of every micro-batch."""
        total = self._total_compute(s.tp, s.cp, s.ep, s.micro_batch_size)
        return self.num_microbatches(s) * total / s.pp

    def _total_compute_uncached(self, tp: int, cp: int, ep: int, mbs: int) -> float:
        (stage,) = self._compute(1, 1, tp, cp, ep, mbs)
        return stage[0] + stage[1]

    def schedule_lower_bound_s(self, s: Strategy) -> float:
        """Like `compute_lower_bound_s` for a given layout: (m + (pp-1)/v) slots of the
        busiest stage's forward and backward compute."""
        compute = self._compute(s.pp, s.virtual_stages, s.tp, s.cp, s.ep, s.micro_batch_size)
        slots = self.num_microbatches(s) + (s.pp - 1) / s.virtual_stages
        return slots * max(f + b for f, b, _, _ in compute)

    def links(self, s: Strategy) -> dict[str, AxisLink]:
        """The link each communication group uses under the strategy's mesh order."""
        gpn = self.cluster.gpus_per_node
        sizes = {MeshAxis.PP: s.pp, MeshAxis.DP: s.dp, MeshAxis.CP: s.cp, MeshAxis.TP: s.tp}
        placed = place_axes(sizes, s.mesh_order, gpn)
        links = {str(a): link_of(n, stride, gpn) for a, (n, stride) in placed.items()}
        dp_n, dp_stride = placed[MeshAxis.DP]
        links["ep"] = link_of(s.ep, dp_stride, gpn)  # experts split the innermost part of dp
        links["dpcp"] = merge_links(links["dp"], links["cp"])
        expert_dp = link_of(dp_n // s.ep, dp_stride * s.ep, gpn)
        links["edp"] = merge_links(expert_dp, links["cp"])
        return links

    def time(
        self,
        s: Strategy,
        links: dict[str, AxisLink] | None = None,
        coll: Collectives | None = None,
    ) -> TimeBreakdown:
        """Step-time breakdown of the strategy (links default to its mesh order's; `coll`
        to this accelerator's collectives)."""
        links = self.links(s) if links is None else links
        coll = self.coll if coll is None else coll
        p = self.profile
        m, mbs, v = self.num_microbatches(s), s.micro_batch_size, s.virtual_stages
        stages = self._stages(s.pp, v)
        compute = self._compute(s.pp, v, s.tp, s.cp, s.ep, mbs)
        tokens = mbs * p.seq_len / s.cp
        act = mbs * self.block_output_seq_bytes / s.cp  # one micro-batch's (b, s/cp, h) tensor
        tp_link = links["tp"]
        if s.sequence_parallel:
            tp_unit = coll.all_gather(act, tp_link) + coll.reduce_scatter(act, tp_link)
        else:
            tp_unit = coll.all_reduce(act, tp_link)
        kv_shard = max(1, min(s.tp, p.kv_heads))
        kv_bytes = 2 * tokens * (p.kv_heads * p.hidden // p.heads) / kv_shard * self.train.act_bytes
        cp_ring = (s.cp - 1) * coll.p2p(kv_bytes, links["cp"].nodes > 1) if s.cp > 1 else 0.0
        a2a_bytes = act * p.top_k / (s.tp if s.sequence_parallel else 1)
        a2a = coll.all_to_all(a2a_bytes, links["ep"]) if s.ep > 1 else 0.0
        p2p = coll.p2p(self._boundary_bytes(s), links["pp"].nodes > 1) if s.pp > 1 else 0.0
        per_mb: list[tuple[float, float, float, float]] = []
        tails: list[tuple[float, float]] = []
        for i, stage in enumerate(stages):
            fwd, bwd, _, rc_sel = compute[i]
            rc, n_full, n_full_moe = self.per_layer.stage_recompute(s, stage, compute[i])
            # TP: 2 collectives per block forward and 2 backward (Narayanan et al. 2021 §3.2,
            # Korthikanti §4.2.2 with SP: all-gather + reduce-scatter), redone when recomputed.
            units = stage.n_blocks * 4 + n_full * 2
            units += int(stage.has_embedding) + int(stage.has_head)
            comm = units * tp_unit if s.tp > 1 else 0.0
            if s.cp > 1:  # ring attention overlaps the KV ring with attention (Liu et al. 2023)
                attn_f = rc_sel  # attention-core forward seconds of this stage
                comm += max(0.0, stage.n_blocks * cp_ring - attn_f)
                comm += max(0.0, 2 * stage.n_blocks * cp_ring - 2 * attn_f)
            # EP: dispatch and combine all-to-all, forward and backward (Lepikhin et al. 2020)
            comm += (stage.n_moe_blocks * 4 + n_full_moe * 2) * a2a
            if s.pp > 1:  # activations forward and gradients backward, per chunk
                sends = 2 * len(stage.chunks) - int(stage.index == 0)
                sends -= int(stage.index == s.pp - 1)
                comm += sends * p2p
            zero_mb, tail = dp_comm(s, stage, links, coll, self.train, fwd, bwd)
            per_mb.append((fwd + bwd, rc, comm + zero_mb, fwd + bwd + rc + comm + zero_mb))
            tails.append((tail, optimizer_s(s, stage, self.train, self.acc)))
        slow = max(range(len(stages)), key=lambda k: per_mb[k][3])
        t_mb = per_mb[slow][3]
        bubble = (s.pp - 1) / v * t_mb  # (p-1)/v slots of fill and drain (Narayanan §2.2)
        tail_i = max(range(len(stages)), key=lambda k: sum(tails[k]))
        return TimeBreakdown(
            compute_s=m * per_mb[slow][0],
            recompute_s=m * per_mb[slow][1],
            comm_s=m * per_mb[slow][2] + tails[tail_i][0],
            bubble_s=bubble,
            optimizer_s=tails[tail_i][1],
        )

    # ---- all together ----------------------------------------------------------------------
    def evaluate(self, s: Strategy) -> Estimate:
        """Predictions for a structurally valid strategy (see `violation`)."""
        rule = self.violation(s)
        if rule:
            raise ValueError(f"strategy {s.short()} is not valid: {rule}")
        memory, peak_stage = self.memory(s)
        return self.finish(s, memory, peak_stage, self.time(s))

    def finish(
        self, s: Strategy, memory: MemoryBreakdown, peak_stage: int, time: TimeBreakdown
    ) -> Estimate:
        """Assemble an `Estimate` from its memory and time parts."""
        t = self.train
        step = time.step_time_s
        slots = self.num_microbatches(s) + (s.pp - 1) / s.virtual_stages
        model_flops = self.model_flops_per_seq * t.global_batch
        peak = self.acc.peak_flops_for(t.compute_dtype)
        return Estimate(
            strategy=s,
            num_microbatches=self.num_microbatches(s),
            step_time_s=step,
            tokens_per_s=t.tokens_per_step / step,
            mfu=model_flops / (step * self.cluster.num_gpus * peak),
            memory=memory,
            peak_stage=peak_stage,
            capacity_bytes=self.capacity_bytes,
            bubble_fraction=(s.pp - 1) / s.virtual_stages / slots,
            exposed_comm_s=time.comm_s,
            time=time,
        )
