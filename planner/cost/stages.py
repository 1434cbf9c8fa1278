"""The per-layout stage model: which layers each pipeline stage runs, what each layer costs on
one rank, and what a stage holds in memory whatever the micro-batch. The evaluator and the
per-layer recompute solver read it; everything is memoized (the search asks again and again).
"""

from __future__ import annotations

from functools import cache, partial
from itertools import accumulate

from ..cluster import Cluster
from ..config import SelectiveRecompute, TrainConfig
from ..model import LayerCost, LayerKind, ModelProfile
from ..strategy import Recompute, Schedule, Strategy
from .calibrated import CalibratedKernels
from .comm import Collectives, link_of
from .compute import (
    EAGER_BACKWARD_FACTOR,
    EAGER_BLOCK_KERNELS,
    Kernels,
    eager_block_elements,
    is_math_attention,
    layer_gemms,
)
from .count_split import CountSplit
from .data_parallel import DDP_BUCKET_BYTES
from .eager import traced_layer_s
from .float8 import float8_linears, kernels_for, layer_kept_bytes, te_weight_copy_bytes
from .kernel_cache import gemm_kernel_cache_bytes
from .layout import Layout, Stage, StageSplit
from .memo import memo_method, weak_method
from .memory import (
    BUCKETS_IN_FLIGHT,
    held_zero_stage,
    layer_tmp_bytes,
    model_state_bytes,
    step_tmps,
)
from .selective import every_other_matmul_s, is_default, modules_recompute_s, selective_kept_bytes
from .stage_layout import StageLayouts
from .stage_parts import LayerTimes, StageActivations, StageCompute, StaticMemory

_LAYER_KEY = ("kind", "params", "expert_params", "fwd_flops", "bwd_flops", "attn_core_fwd_flops",
    "act_tp_bytes", "act_replicated_bytes", "act_attn_core_bytes", "act_norm_copy_bytes",
    "act_glu_copy_bytes", "input_bytes")  # fmt: skip
"""`LayerCost` fields whose values make two layers cost the same (`StageModel.layer_keys`)."""
Policy = Recompute | tuple[Recompute, ...]
_UNIFORM = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
"""A uniform recompute policy, or one policy per chain layer."""

ACT_IO_FACTOR = 2
"""A layer writes its saved activations in forward and reads them in backward (roofline)."""


class StageModel:
    """Layout, per-layer seconds and static memory of one model, cluster and config."""

    def __init__(
        self,
        profile: ModelProfile,
        cluster: Cluster,
        train: TrainConfig,
        split: StageSplit | CountSplit = StageSplit.BALANCED,
    ) -> None:
        self.profile, self.cluster, self.train = profile, cluster, train
        self.split = split
        """How blocks are split over pipeline chunks."""
        self.acc = acc = cluster.accelerator
        cal = cluster.calibration
        kinds, skew = (None, 0.0) if cal is None else (cal.kind_link_figures(), cal.skew_s)
        self.coll = Collectives(acc, kind_links=kinds, sync_skew_s=skew)
        self.tp_dispatch = None if cal is None else cal.tensor_parallel
        """DTensor's measured host cost (calibrated clusters with more than one rank)."""
        self.tp_runtime_bytes = 0.0 if cal is None else cal.tp_runtime_bytes  # its resident
        self.kernels: Kernels | None = kernels_for(cluster, train)
        """GEMM and attention kernel model (None: roofline only)."""
        self.fp8 = float8_linears(cluster, train, self.kernels)  # None unless fp8
        self.flops_per_s = acc.peak_flops_for(train.compute_dtype) * acc.matmul_efficiency
        """Achieved matmul FLOP/s (peak times the catalog's efficiency)."""
        self.capacity_bytes = acc.memory_bytes * (1.0 - train.memory_headroom)
        """Usable bytes per GPU."""
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
        self.layer_keys: tuple[tuple, ...] = tuple(
            tuple(getattr(x, name) for name in _LAYER_KEY) for x in profile.layers
        )
        """What makes two layers cost the same (identical layers share their decisions)."""
        self.num_blocks = profile.num_blocks
        unit_costs_s = weak_method(self, StageModel.unit_costs_s)
        self.layouts = StageLayouts(profile, split, self.layer_keys, unit_costs_s)
        """Chunks and stages per layout (`stage_layout.py`)."""
        self.chunks = self.layouts.chunks
        self.stages = self.layouts.stages
        self.stage_copies = self.layouts.stage_copies
        self.layer_times = memo_method(self, StageModel._layer_times)
        self.stage_compute = memo_method(self, StageModel._stage_compute)
        self._compute_of: dict[tuple, StageCompute] = {}  # by (id(stage), tp, cp, ep, mbs)
        self._static: dict[tuple, tuple[Stage, StaticMemory]] = {}  # by the stage's id
        self.uniform = memo_method(self, StageModel._uniform)
        self.act_prefix = memo_method(self, StageModel._act_prefix)
        self._act_terms = memo_method(self, StageModel._act_terms_uncached)
        self.step_tmp = cache(partial(step_tmps, profile.layers, self.act_scale))
        self.stage_activations = memo_method(self, StageModel._stage_activations)

    def num_microbatches(self, s: Strategy) -> int:
        """Micro-batches per replica per step."""
        return self.train.global_batch // (s.dp * s.micro_batch_size)

    # ---- layout ---------------------------------------------------------------------------
    def layout(
        self, pp: int, v: int, policy: Policy, tp: int, sp: bool, schedule: Schedule | None = None
    ) -> Layout:
        """The layout a strategy's stages are cut for. A uniform selective or full policy
        changes how blocks weigh against the embedding and head (which never recompute); no
        recompute and per-layer policies (solved on that layout) use `none`. Without a
        pipeline there is one layout."""
        rc = policy if policy in (Recompute.SELECTIVE, Recompute.FULL) else Recompute.NONE
        return self.layouts.layout(pp, v, rc, tp, sp, schedule)  # type: ignore[arg-type]

    def layout_of(self, s: Strategy) -> Layout:
        """`layout` of a strategy (chunks in a V for ZB-V and DualPipeV)."""
        sp, schedule = s.sequence_parallel, s.schedule
        return self.layout(s.pp, s.virtual_stages, s.recompute, s.tp, sp, schedule)

    def unit_costs_s(self, lay: Layout) -> list[float]:
        """Seconds per sequence on one GPU of each block (forward, backward, the recompute of
        the layout's policy and its TP collectives inside one node), the embedding's added to
        the first block and the head's to the last: what the partition balances."""
        t = self.layer_times(lay.tp, 1, 1, 1)
        tp_unit = 0.0
        if lay.tp > 1:
            link = link_of(lay.tp, 1, self.cluster.gpus_per_node)
            act = self.block_output_seq_bytes
            if lay.sequence_parallel:
                tp_unit = self.coll.all_gather(act, link) + self.coll.reduce_scatter(act, link)
            else:
                tp_unit = self.coll.all_reduce(act, link)
        costs, emb, head = [], 0.0, 0.0
        for i, x in enumerate(self.profile.layers):
            c = t.layer(i)
            seconds = c.fwd_s + c.bwd_s
            if x.kind != LayerKind.BLOCK:
                seconds += tp_unit  # the embedding's or head's one TP collective
                emb += seconds if x.kind == LayerKind.EMBEDDING else 0.0
                head += seconds if x.kind == LayerKind.HEAD else 0.0
                continue
            if lay.recompute == Recompute.FULL:
                seconds += c.full_recompute_s + 2 * tp_unit
            elif lay.recompute == Recompute.SELECTIVE:
                seconds += c.selective_recompute_s
            costs.append(seconds + 4 * tp_unit)
        costs[0] += emb
        costs[-1] += head
        return costs

    # ---- compute --------------------------------------------------------------------------
    def roofline_s(self, flops: float, nbytes: float) -> float:
        """max(compute-bound, memory-bound) time: the roofline (Williams et al. 2009)."""
        return max(flops / self.flops_per_s, nbytes / self.acc.memory_bw_bytes_per_s)

    def _layer_times(self, tp: int, cp: int, ep: int, mbs: int) -> LayerTimes:
        """Per-micro-batch seconds of each chain layer on one rank, as prefix sums (summed left
        to right from 0.0, as the stages' sums read them)."""
        seen: dict[tuple, tuple[float, float, float, float, float]] = {}
        for key, x in zip(self.layer_keys, self.profile.layers, strict=True):
            if key not in seen:
                seen[key] = self._one_layer(x, tp, cp, ep, mbs)
        columns = zip(*(seen[key] for key in self.layer_keys), strict=True)
        return LayerTimes(*(tuple(accumulate(col, initial=0.0)) for col in columns))

    def _one_layer(
        self, x: LayerCost, tp: int, cp: int, ep: int, mbs: int
    ) -> tuple[float, float, float, float, float]:
        """(forward, backward, full recompute, selective recompute, attention forward) seconds
        of one layer for
        one micro-batch on one rank. Transformer blocks and heads on a GPU with a kernel table
        are priced GEMM by GEMM and flash attention (`compute.py`); other layers, and devices
        without a table, on the roofline with the catalog's matmul efficiency. Both add the
        memory-bound elementwise kernels (norms, activations, residuals) streaming the
        activations they save. Measured times, when profiled on this accelerator, win."""
        t = self.train
        block = x.kind == LayerKind.BLOCK
        acts = ACT_IO_FACTOR * mbs * (x.act_tp_bytes / tp + x.act_replicated_bytes) / cp
        elementwise = acts * self.act_scale / self.acc.memory_bw_bytes_per_s
        if self.measured and x.fwd_time_s is not None and x.bwd_time_s is not None:
            f = x.fwd_time_s * mbs / (tp * cp)  # measured on this accelerator, split ideally
            b = x.bwd_time_s * mbs / (tp * cp)
            sel = x.attn_core_fwd_flops * mbs / (tp * cp) / self.flops_per_s if block else 0.0
            return f, b, f if block else 0.0, sel, sel
        gemms = layer_gemms(self.profile, x, tp) if self.kernels is not None else None
        traced = self.op_by_op_kernels(x)
        if gemms is None and traced is not None:  # no GEMM of a known shape: at peak rate
            rate = traced.fit.peak_gemm_flops_per_s() / traced.time_scale
            dense = (x.fwd_flops - x.attn_core_fwd_flops) * mbs / (tp * cp)
            dense_b = max(0.0, x.bwd_flops - 2 * x.attn_core_fwd_flops) * mbs / (tp * cp)
            gemm_s = (dense / rate, dense_b / rate)
            return traced_layer_s(
                traced,
                self.profile,
                self.train,
                self.act_scale,
                x,
                tp,
                cp,
                mbs,
                gemm_s,
                self.tp_dispatch,
            )
        if self.kernels is None or gemms is None:
            weights = (x.params / tp + x.expert_params / (tp * ep)) * t.param_bytes
            f = self.roofline_s(x.fwd_flops * mbs / (tp * cp), weights) + elementwise
            b = self.roofline_s(x.bwd_flops * mbs / (tp * cp), 2 * weights) + elementwise
            core = x.attn_core_fwd_flops * mbs / (tp * cp) / self.flops_per_s if block else 0.0
            tokens = mbs * self.profile.seq_len / cp
            sel = self._modules_s(self.kernels, x, core, tokens, tp) if block else 0.0
            return f, b, f if block else 0.0, sel, core
        k, p = self.kernels, self.profile
        tokens = mbs * p.seq_len / cp
        f = b = 0.0
        for g in gemms:
            gf, gb = self._linear_s(k, block, max(1, round(tokens * g.per_token)), g.n, g.k)
            f, b = f + gf, b + gb
        core_bytes = x.act_attn_core_bytes * self.act_scale * mbs / (tp * cp)
        if traced is not None:
            return traced_layer_s(
                traced, p, self.train, self.act_scale, x, tp, cp, mbs, (f, b), self.tp_dispatch
            )
        if block and is_math_attention(p, x):
            heads = max(1, mbs * p.heads // tp)
            attn_f, attn_b = k.math_attention_s(
                heads, p.seq_len // cp, p.seq_len, p.head_size, core_bytes
            )
        else:
            attn_flops, seq = x.attn_core_fwd_flops * mbs / (tp * cp), p.seq_len // cp
            attn_f, attn_b = k.attention_s(attn_flops, seq_len=seq)
        streamed = acts * self.act_scale - ACT_IO_FACTOR * core_bytes  # core: priced above
        elementwise_f = elementwise_b = k.elementwise_s(max(0.0, streamed))
        gated = len(gemms) == 4 and gemms[2].n * tp == 2 * p.ffn
        if block and not t.runtime.fused_elementwise:
            # Eager PyTorch: every norm, rotary, activation and residual operator is a kernel
            # of its own streaming its inputs and output (compute.eager_block_elements).
            elems = eager_block_elements(p, tp, True, gated) * tokens * self.train.act_bytes
            elementwise_f += k.elementwise_s(elems) + k.launch_s * EAGER_BLOCK_KERNELS
            elementwise_b += k.elementwise_s(EAGER_BACKWARD_FACTOR * elems)
            elementwise_b += EAGER_BACKWARD_FACTOR * k.launch_s * EAGER_BLOCK_KERNELS
        f += attn_f + elementwise_f
        b += attn_b + elementwise_b
        sel = attn_f
        if block and t.runtime.selective == SelectiveRecompute.EVERY_OTHER_MATMUL:
            linear_f = partial(self._linear_f, k, block)
            sel = every_other_matmul_s(
                linear_f, p, tp=tp, gated=gated, tokens=tokens, elementwise_f=elementwise_f
            )
        elif block:
            sel = self._modules_s(k, x, attn_f, tokens, tp)
        return f, b, f if block else 0.0, sel, attn_f

    def _modules_s(
        self, k: Kernels | None, x: LayerCost, attn: float, tokens: float, tp: int
    ) -> float:
        """Forward seconds selective recompute redoes in a block (Megatron-Core's modules)."""
        r = self.train.runtime
        if k is None or is_default(r) or r.selective != SelectiveRecompute.ATTENTION_CORE:
            return attn
        return modules_recompute_s(
            k, self.profile, x, r.recompute_modules, attn_f=attn, tokens=tokens, tp=tp, sp=True,
            act_bytes=self.train.act_bytes, linear_f=partial(self._linear_f, k, True),
        )  # fmt: skip

    def _linear_f(self, kernels: Kernels, block: bool, m: int, n: int, k: int) -> float:
        """Forward seconds of `_linear_s`."""
        return self._linear_s(kernels, block, m, n, k)[0]

    def _linear_s(
        self, kernels: Kernels, block: bool, m: int, n: int, k: int
    ) -> tuple[float, float]:
        """(forward, backward) seconds of a layer's (m x k) @ (k x n) GEMM in training on
        `kernels` (the step's): a block's in fp8 under fp8 training (`float8.py`), else in the
        compute dtype."""
        if block and self.fp8 is not None:
            return self.fp8.gemm_train_s(kernels, m, n, k)
        return kernels.gemm_train_s(m, n, k)

    def op_by_op_kernels(self, x: LayerCost) -> CalibratedKernels | None:
        """The calibrated kernels when `x` is priced from its traced operators (`eager.py`):
        a traced layer on a calibrated device running eager PyTorch; else None."""
        k = self.kernels
        if isinstance(k, CalibratedKernels) and x.fwd_ops > 0:
            return None if self.train.runtime.fused_elementwise else k
        return None

    def _stage_compute(
        self, lay: Layout, tp: int, cp: int, ep: int, mbs: int
    ) -> tuple[StageCompute, ...]:
        """Per distinct stage (`stages(lay)`), seconds per micro-batch on one rank."""
        t = self.layer_times(tp, cp, ep, mbs)
        fwd, bwd, full = t.fwd_s, t.bwd_s, t.full_recompute_s
        sel, attn = t.selective_recompute_s, t.attention_fwd_s
        out = []
        for stage in self.stages(lay):
            # layouts that share a placement share their Stage objects (`StageLayouts`), which
            # live as long as this model: their ids key the sums
            key = (id(stage), tp, cp, ep, mbs)
            known = self._compute_of.get(key)
            if known is not None:
                out.append(known)
                continue
            # each the sum over chunks of `LayerTimes.span`, without building the spans
            chunks = stage.chunks
            if len(chunks) == 1:  # the sum of one term is that term
                i, j = chunks[0].first_layer, chunks[0].last_layer + 1
                f, b, fr = fwd[j] - fwd[i], bwd[j] - bwd[i], full[j] - full[i]
                sr, at = sel[j] - sel[i], attn[j] - attn[i]
            else:
                spans = [(c.first_layer, c.last_layer + 1) for c in chunks]
                f = sum(fwd[j] - fwd[i] for i, j in spans)
                b = sum(bwd[j] - bwd[i] for i, j in spans)
                fr = sum(full[j] - full[i] for i, j in spans)
                sr = sum(sel[j] - sel[i] for i, j in spans)
                at = sum(attn[j] - attn[i] for i, j in spans)
            known = self._compute_of[key] = StageCompute(
                fwd_s=f,
                bwd_s=b,
                full_recompute_s=fr,
                selective_recompute_s=sr,
                attention_fwd_s=at,
            )
            out.append(known)
        return tuple(out)

    def total_compute_s(self, tp: int, cp: int, ep: int, mbs: int) -> float:
        """Forward + backward seconds of one micro-batch through the whole model on one rank."""
        t = self.layer_times(tp, cp, ep, mbs)  # memoized
        return t.fwd_s[-1] + t.bwd_s[-1]

    # ---- memory ---------------------------------------------------------------------------
    def static_memory(
        self,
        stage: Stage,
        tp: int,
        ep: int,
        dpcp: int,
        zero: int,
        offload: bool,
        replicate: int = 1,
    ) -> StaticMemory:
        """`_static_memory`, memoized by the stage's id (the stage kept alive with the answer:
        hashing a `Stage` hashes its layers and chunks)."""
        key = (id(stage), tp, ep, dpcp, zero, offload, replicate)
        found = self._static.get(key)
        if found is None:
            memory = self._static_memory(stage, tp, ep, dpcp, zero, offload, replicate)
            found = self._static[key] = (stage, memory)
        return found[1]

    def _static_memory(
        self,
        stage: Stage,
        tp: int,
        ep: int,
        dpcp: int,
        zero: int,
        offload: bool,
        replicate: int = 1,
    ) -> StaticMemory:
        """What a stage holds whatever the micro-batch (ZeRO-1's states for ZeRO-2/3 beside a
        pipeline: `held_zero_stage`). Dense parameters shard over the dp*cp group, or its HSDP
        shard group (dpcp / `replicate`); experts over the expert-data-parallel group."""
        t, states = self.train, [0.0, 0.0, 0.0]
        zero = held_zero_stage(zero, len(stage.layers) < len(self.profile.layers))
        dense_rank = stage.dense_params / tp
        expert_rank = stage.expert_params / (tp * ep)
        for count, ranks in ((dense_rank, dpcp // replicate), (expert_rank, dpcp // ep)):
            if count:
                part = model_state_bytes(
                    count, shard_ranks=ranks, zero_stage=zero, train=t, offload_optimizer=offload
                )
                states = [x + y for x, y in zip(states, part, strict=True)]
        other = self._runtime_bytes(stage, tp)  # with Transformer Engine's fp8 weight copies
        other += te_weight_copy_bytes(self.fp8, t.runtime, self.profile, stage, tp, ep)
        if zero == 3 and dpcp > 1:
            # FSDP keeps the current and the prefetched block unsharded, plus one block's
            # unsharded gradients before reduce-scatter (Zhao et al. 2023, PyTorch FSDP §3.2).
            block = stage.max_block_params / tp + stage.max_block_expert_params / (tp * ep)
            other += block * (2 * t.param_bytes + t.grad_bytes)
        elif dpcp > 1 and (tp > 1 or offload or len(stage.chunks) > 1 or not stage.has_head):
            # not torch DDP (tp = pp = 1): its buckets are the gradients (bucket views)
            other += BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES
        return StaticMemory(
            params_bytes=states[0],
            grads_bytes=states[1],
            optimizer_bytes=states[2],
            other_bytes=other,
        )

    def _runtime_bytes(self, stage: Stage, tp: int) -> float:
        """The runtime's resident bytes (DTensor's too beside TP), and on a calibrated CPU what
        the GEMM library keeps for the stage's layers (`kernel_cache.py`)."""
        base = self.acc.runtime_overhead_bytes + (self.tp_runtime_bytes if tp > 1 else 0.0)
        if not isinstance(self.kernels, CalibratedKernels):
            return base
        layers = [self.profile.layers[i] for i in stage.layers]
        return base + gemm_kernel_cache_bytes(self.profile, layers, tp, self.kernels.fit)

    def boundary_bytes(self, s: Strategy, sp: bool | None = None) -> float:
        """Bytes of one micro-batch's activation crossing a stage boundary (per rank), with
        sequence parallelism `sp` (default: the strategy's)."""
        sp = s.sequence_parallel if sp is None else sp
        div = s.cp * (s.tp if sp else 1)
        return s.micro_batch_size * self.block_output_seq_bytes / div

    def _uniform(self, rc: Recompute) -> tuple[Recompute, ...]:
        """One policy per chain layer: `rc` on the blocks, none elsewhere."""
        blocks = (x.kind == LayerKind.BLOCK for x in self.profile.layers)
        return tuple(rc if is_block else Recompute.NONE for is_block in blocks)

    def _act_prefix(
        self, tp: int, sp: bool, cp: int, recompute: Policy
    ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """Per chain layer, per sequence, in the training dtype: prefix sums of the bytes kept
        under `recompute` (uniform, or one policy per layer); what recomputing each fully
        recomputed block adds back (its bytes without recompute less what full recompute
        keeps; 0 for other layers); its transient peak."""
        prefix = [0.0]
        kept_of, back_of, tmp = self._act_terms(tp, sp, cp)
        policies = self.uniform(recompute) if isinstance(recompute, Recompute) else recompute
        for kept, policy in zip(kept_of, policies, strict=True):
            prefix.append(prefix[-1] + kept[policy])
        pairs = zip(back_of, policies, strict=True)
        back = [b if policy == Recompute.FULL else 0.0 for b, policy in pairs]
        return tuple(prefix), tuple(back), tmp

    def _act_terms_uncached(
        self, tp: int, sp: bool, cp: int
    ) -> tuple[tuple[dict[Recompute, float], ...], tuple[float, ...], tuple[float, ...]]:
        """Per chain layer, per sequence, in the training dtype: the bytes kept under each
        uniform policy, what recomputing it fully adds back (0 for layers that are not
        blocks) and its transient peak (`_act_prefix` sums them for a policy per layer)."""
        kept_of, back, tmp = [], [], []
        k = self.act_scale
        kept_bytes = partial(
            layer_kept_bytes,
            self.fp8,
            self.profile,
            tp=tp,
            sp=sp,
            cp=cp,
            runtime=self.train.runtime,
        )
        loss, runtime = self.train.runtime.torch_loss, self.train.runtime
        for x in self.profile.layers:
            none, core, full = (kept_bytes(x, recompute=r) for r in _UNIFORM)
            one = selective_kept_bytes(
                runtime, self.profile, x, kept_none=none, kept_core=core, tp=tp, sp=sp, cp=cp
            )
            kept_of.append(dict(zip(_UNIFORM, (none * k, one * k, full * k), strict=True)))
            if x.kind == LayerKind.BLOCK:
                back.append((none - full) * k)
            else:
                back.append(0.0)
            tmp.append(layer_tmp_bytes(x, self.profile, act_scale=k, tp=tp, cp=cp, torch_loss=loss))
        return tuple(kept_of), tuple(back), tuple(tmp)

    def _stage_activations(
        self, lay: Layout, tp: int, sp: bool, cp: int, recompute: Policy
    ) -> tuple[StageActivations, ...]:
        """Per distinct stage: activation bytes kept and transient, per sequence.

        The transient is the largest of the layers' profiled forward/backward peaks and, under
        full recompute, what re-materializing one block adds back on top of the kept inputs
        (less its own input, already kept), after the head's backward has freed the head's
        activations (Korthikanti et al. 2022 §5)."""
        prefix, back, tmp = self.act_prefix(tp, sp, cp, recompute)
        steps = self.step_tmp(tp)
        out = []
        for stage in self.stages(lay):
            per_seq = sum(prefix[c.last_layer + 1] - prefix[c.first_layer] for c in stage.chunks)
            spans = [(c.first_layer, c.last_layer + 1) for c in stage.chunks]
            worst = max(max(back[a:b]) for a, b in spans)
            head = prefix[-1] - prefix[-2] if stage.has_head else 0.0
            transient = max(0.0, worst - head, max(max(tmp[a:b]) for a, b in spans))
            step = max(max(steps[a:b]) for a, b in spans)
            out.append(
                StageActivations(
                    kept_bytes=per_seq,
                    transient_bytes=transient,
                    step_transient_bytes=step,
                    head_kept_bytes=head,
                )
            )
        return tuple(out)
