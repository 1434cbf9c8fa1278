"""A strategy's predicted step time, throughput, MFU and memory per GPU: the stage model's
layout, per-layer seconds and static memory (`stages.py`) and `per_layer.py`'s recompute put
together. Each term names its source; docs/cost-model.md lists them with their units."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from ..cluster import Cluster
from ..config import FP32_BYTES, Float8Casts, Optimizer, TrainConfig
from ..model import LayerKind, ModelProfile
from ..strategy import MeshAxis, Recompute, Schedule, Strategy
from . import schedules as split_schedules
from .calibrated import CalibratedKernels
from .comm import Collectives, Links, links_for
from .count_split import CountSplit
from .data_parallel import (
    OVERLAP_CONTENTION,
    FsdpHost,
    ddp_last_bucket_bytes,
    dp_comm,
    optimizer_s,
    optimizer_shard_params,
)
from .eager import unfused_adamw_s
from .estimate import Estimate, StageTime, TimeBreakdown
from .float8 import block_weight_elements
from .layout import Stage, StageSplit
from .memo import memo_method
from .memory import MemoryBreakdown, head_in_flight, in_flight_microbatches
from .mixed_precision import autocast_held_bytes, autocast_s
from .options import OptionModel, has_options, option_problem
from .per_layer import PerLayerRecompute
from .recompute_pattern import RecomputePattern
from .rules import Assignment, ProblemShape, Violation, violation
from .stage_core import StageCore, StageCores
from .stages import Policy, StageActivations, StageModel, StaticMemory


class Evaluator:
    """Evaluates strategies for one model, cluster and training config (memoized)."""

    def __init__(
        self,
        profile: ModelProfile,
        cluster: Cluster,
        train: TrainConfig,
        split: StageSplit | CountSplit = StageSplit.BALANCED,
        pattern: RecomputePattern | None = None,
    ) -> None:
        if profile.seq_len != train.seq_len:
            raise ValueError(
                f"the model profile is for seq_len={profile.seq_len} but training uses "
                f"seq_len={train.seq_len}; build the profile at the training sequence length"
            )
        self.profile, self.cluster, self.train = profile, cluster, train
        self.acc = cluster.accelerator
        self.stage_model = StageModel(profile, cluster, train, split)
        """Layout, per-layer seconds and static memory."""
        cal = cluster.calibration
        self.contention = OVERLAP_CONTENTION if cal is None else cal.overlap_contention
        """Compute slowdown per second of overlapped communication (measured when calibrated)."""
        self.fsdp = FsdpHost.of(self.stage_model.kernels, self.acc, cal)
        scale = 1.0 if cal is None else cal.time_scale
        self.optimizer_scale = 1.0 if cal is None else cal.optimizer_scale
        """The optimizer step's refitted scale beyond `time_scale` (`calibration_refit`)."""
        self.dtensor_adamw_tensor_s = 0.0 if cal is None else cal.dtensor_adamw_tensor_s * scale
        host = cal.host_adamw_s_per_param * scale if cal is not None else 0.0
        self.host_adamw_s_per_param = host if train.optimizer == Optimizer.ADAMW else 0.0
        self.coll = self.stage_model.coll  # the calibrated links and sync skew
        self.lower_bound_coll = Collectives(self.acc, lower_bound=True)
        """Collectives on the fastest link with no latency: bounds for the search."""
        self.model_flops_per_seq = sum(x.fwd_flops + x.bwd_flops for x in profile.layers)
        self.num_blocks = profile.num_blocks
        self.num_moe_blocks = sum(
            1 for x in profile.layers if x.kind == LayerKind.BLOCK and x.expert_params
        )
        """Blocks with experts (their MLP has no TP collectives when the experts fold over TP)."""
        self.shape = ProblemShape.of(profile, cluster, train)
        """What the structural rules read (see `violation`)."""
        self.per_layer = PerLayerRecompute(self.stage_model, pattern)
        """Per-layer policies: solved, or a trainer's `pattern` for `per_layer` strategies."""
        self.options = OptionModel(self.stage_model, train, self.acc)
        """PowerSGD, parameter/activation offload and asynchronous pipeline terms."""
        ddp_last = ddp_last_bucket_bytes(profile.layers, train.grad_bytes)
        self._dp_comm = partial(
            dp_comm,
            powersgd=self.options.powersgd,
            contention=self.contention,
            fsdp=self.fsdp,
            ddp_last_bytes=ddp_last,
        )  # the ZeRO/DDP traffic with this model's fixed figures
        self.weight_share = split_schedules.weight_grad_share(profile)
        """Share of a backward that is weight gradients (split-backward schedules)."""
        self._links = memo_method(self, Evaluator._links_uncached)
        self.cores = StageCores(
            self.stage_model,
            self.per_layer,
            train,
            self.contention,
            self.coll,
            self.lower_bound_coll,
        )
        """Memoized `stage_core` (stage_core.py)."""
        self._ideal: dict[int, tuple[Links, Links]] = {}  # `ideal_links`, by id of `links`
        self._in_flight: dict[tuple, tuple[float, ...]] = {}  # `in_flight` results
        self._statics: dict[tuple, tuple[float, ...]] = {}  # `static_totals`, by stage ids
        self._timelines: dict[tuple, tuple[float, float]] = {}  # `_backward_timeline` peaks

    @property
    def capacity_bytes(self) -> float:
        """Usable bytes per GPU (the stage model's)."""
        return self.stage_model.capacity_bytes

    # ---- structure ------------------------------------------------------------------------
    def num_microbatches(self, s: Strategy) -> int:
        """Micro-batches per replica per step."""
        return self.stage_model.num_microbatches(s)

    def violation(self, a: Assignment) -> Violation | None:
        """The first structural rule `a` breaks (partial `Pins`: whatever the rest), or None."""
        return violation(self.shape, a)

    def recompute_saved_bytes(self, s: Strategy) -> float:
        """Peak memory per GPU the strategy's recompute saves against recomputing nothing."""
        if s.recompute == Recompute.NONE:
            return 0.0
        plain = self.memory(replace(s, recompute=Recompute.NONE))[0].total_bytes
        return max(0.0, plain - self.memory(s)[0].total_bytes)

    def policy(self, s: Strategy) -> Policy:
        """The strategy's activation policy: uniform, or per layer as solved."""
        return s.recompute if s.recompute != Recompute.PER_LAYER else self.per_layer.policies(s)

    # ---- memory ---------------------------------------------------------------------------
    def memory(self, s: Strategy) -> tuple[MemoryBreakdown, int]:
        """Peak memory breakdown over the pipeline stages, and the stage that peaks."""
        sm = self.stage_model
        lay = sm.layout_of(s)
        acts = sm.stage_activations(lay, s.tp, s.sequence_parallel, s.cp, self.policy(s))
        stages = sm.stages(lay)
        mems = [self._stage_memory(s, st, acts[i]) for i, st in enumerate(stages)]
        if self.single_pass(s):
            mems = [self._backward_timeline(s, mems[0])]
        peak = max(range(len(mems)), key=lambda i: mems[i].total_bytes)
        return mems[peak], stages[peak].index

    def single_pass(self, s: Strategy, zero: int | None = None) -> bool:
        """One micro-batch, no pipeline (at ZeRO stage `zero`, else `s`'s): gradients (ZeRO-2/3's
        shards too, made as each FSDP2 unit's reduce-scatter ends; gpt-small bf16 ZeRO-3, 2
        gloo ranks, 2026-11-26: 797.7 MB measured, 831.1 priced with whole shards at the peak)
        grow as the activations are freed, layer by layer. Not torch DDP (data parallel alone,
        ZeRO-0/1): its gradients are views of buckets made whole (`gradient_as_bucket_view`)."""
        zero = s.zero_stage if zero is None else zero
        ddp = s.dp * s.cp > 1 and s.tp == 1 and zero < 2
        return s.pp == 1 and self.num_microbatches(s) == 1 and not ddp and not s.offload_activations

    def _backward_timeline(self, s: Strategy, mem: MemoryBreakdown) -> MemoryBreakdown:
        """Peak over the backward pass, which runs from the head to the embedding: at layer i
        the gradients of layers >= i exist and the activations of layers <= i, plus layer i's
        transient (profiled peak, or its re-materialization under full recompute)."""
        p, t, mbs = self.profile, self.train, s.micro_batch_size
        policy = self.policy(s)
        dpcp = s.dp * s.cp if s.zero_stage >= 2 else 1
        dense = s.tp * max(1, dpcp // s.dp_replicate)
        expert = s.tp * s.ep_dp * max(1, dpcp // s.ep_dp)
        key = (s.tp, s.sequence_parallel, s.cp, policy, mbs, dense, expert)
        found = self._timelines.get(key)  # ZeRO and offload variants share it
        if found is None:
            prefix, back, tmp = self.stage_model.act_prefix(s.tp, s.sequence_parallel, s.cp, policy)
            steps = self.stage_model.step_tmp(s.tp)
            grads, best = 0.0, (-1.0, 0.0, 0.0)
            for i in reversed(range(len(p.layers))):
                x = p.layers[i]
                grads += (x.params / dense + x.expert_params / expert) * t.grad_bytes
                acts = prefix[i + 1] * mbs + max(max(tmp[i], back[i]) * mbs, steps[i])
                if grads + acts > best[0]:
                    best = (grads + acts, grads, acts)
            found = self._timelines[key] = (best[1], best[2])
        return replace(mem, grads_bytes=found[0], activations_bytes=found[1])

    def static_memory(self, s: Strategy, stage: Stage) -> StaticMemory:
        """What `stage` holds under `s` whatever the micro-batch."""
        return self.stage_model.static_memory(
            stage, s.tp, s.ep_dp, s.dp * s.cp, s.zero_stage, s.offload_optimizer, s.dp_replicate
        )

    def pipeline_buffer_bytes(self, s: Strategy, sp: bool | None = None) -> float:
        """Send and receive buffers of the stage boundaries, one pair per chunk."""
        if s.pp == 1:
            return 0.0
        return 2 * s.virtual_stages * self.stage_model.boundary_bytes(s, sp)

    def _stage_memory(self, s: Strategy, stage: Stage, acts: StageActivations) -> MemoryBreakdown:
        static = self.static_memory(s, stage)
        inflight = self.in_flight(s.schedule, s.pp, self.num_microbatches(s), s.virtual_stages)[
            stage.index
        ]
        kept = acts.peak_bytes(inflight, s.micro_batch_size, head_in_flight(s.schedule, inflight))
        held = autocast_held_bytes(s, stage, self.stage_model, inflight, self.policy(s))
        mem = MemoryBreakdown(
            params_bytes=static.params_bytes,
            grads_bytes=static.grads_bytes,
            optimizer_bytes=static.optimizer_bytes,
            activations_bytes=kept,
            other_bytes=static.other_bytes + self.pipeline_buffer_bytes(s) + held,
        )
        if has_options(s):  # offload, PowerSGD's buffers, the stashed weights (options.py)
            mem = self.options.memory(s, stage, mem, inflight, self.policy(s))
        return mem

    def in_flight(self, schedule: Schedule, pp: int, m: int, v: int) -> tuple[float, ...]:
        """`memory.in_flight_microbatches` of every stage 0 .. pp-1 (memoized: the search
        asks each stage of each layout again and again)."""
        key = (schedule, pp, m, v)
        found = self._in_flight.get(key)
        if found is None:
            found = self._in_flight[key] = tuple(
                in_flight_microbatches(
                    schedule, pp=pp, stage=st, num_microbatches=m, virtual_stages=v
                )
                for st in range(pp)
            )
        return found

    def static_totals(
        self,
        stages: tuple[Stage, ...],
        tp: int,
        ep: int,
        dpcp: int,
        zero: int,
        offload: bool,
        replicate: int,
    ) -> tuple[float, ...]:
        """`StageModel.static_memory(stage, ...).total_bytes` of each of a layout's `stages`,
        memoized by the stages' ids (they live as long as the stage model)."""
        key = (*map(id, stages), tp, ep, dpcp, zero, offload, replicate)
        found = self._statics.get(key)
        if found is None:
            found = self._statics[key] = tuple(
                self.stage_model.static_memory(
                    st, tp, ep, dpcp, zero, offload, replicate
                ).total_bytes
                for st in stages
            )
        return found

    # ---- time -----------------------------------------------------------------------------
    def links(self, s: Strategy) -> Links:
        """The link each communication group uses under the strategy's mesh order."""
        return self._links(
            s.pp, s.dp, s.cp, s.tp, s.ep_dp, s.mesh_order, s.dp_shard, s.folded_experts
        )

    def links_in_order(self, s: Strategy, order: tuple[MeshAxis, ...]) -> Links:
        """`links` of `s` in another mesh order."""
        return self._links(s.pp, s.dp, s.cp, s.tp, s.ep_dp, order, s.dp_shard, s.folded_experts)

    def ideal_links(self, s: Strategy) -> Links:
        """`links(s).ideal()`: every group inside one node (memoized; for bounds)."""
        links = self.links(s)  # memoized for good: its id names it
        found = self._ideal.get(id(links))
        if found is None:
            found = self._ideal[id(links)] = (links, links.ideal())
        return found[1]

    def _links_uncached(
        self,
        pp: int,
        dp: int,
        cp: int,
        tp: int,
        ep: int,
        order: tuple[MeshAxis, ...],
        dp_shard: int | None,
        folded_experts: bool = False,
    ) -> Links:
        sizes = {MeshAxis.PP: pp, MeshAxis.DP: dp, MeshAxis.CP: cp, MeshAxis.TP: tp}
        gpn = self.cluster.gpus_per_node
        return links_for(sizes, order, ep, gpn, dp_shard, folded_experts=folded_experts)

    def stage_times(
        self,
        s: Strategy,
        links: Links | None = None,
        coll: Collectives | None = None,
        *,
        merged: bool = False,
    ) -> tuple[StageTime, ...]:
        """Seconds of each distinct pipeline stage (`StageModel.stages`) under the strategy
        (links default to its mesh order's; `coll` to this accelerator's collectives). With
        `merged` (bounds only), a split backward's stages that look alike once
        (`StageCores.get`)."""
        links = self.links(s) if links is None else links
        coll = self.coll if coll is None else coll
        out = []
        for core in self.cores.get(s, links, coll, merged=merged):
            c, stage = core.compute, core.stage
            zero_mb, tail = self._dp_comm(s, stage, links, coll, self.train, c.fwd_s, c.bwd_s)
            if s.offload_optimizer or s.offload_activations:  # PCIe copies (offload.py)
                zero_mb += self.options.offload.cost(s, stage, c, self.policy(s)).exposed_s
            cast_f, cast_b = autocast_s(s, stage, self.stage_model)
            out.append(
                StageTime(
                    stage=stage.index,
                    fwd_s=c.fwd_s + cast_f,
                    bwd_s=c.bwd_s + cast_b,
                    recompute_s=core.recompute_s,
                    comm_s=core.comm_s + zero_mb,
                    tail_comm_s=tail,
                    optimizer_s=self._optimizer_s(s, stage) + self._fp8_weight_cast_s(s, stage),
                )
            )
        return tuple(out)

    def stage_core(
        self, s: Strategy, links: Links, coll: Collectives, *, merged: bool = False
    ) -> tuple[StageCore, ...]:
        """`StageCores.get` (stage_core.py): `stage_times` less the data-parallel, offload and
        optimizer terms, memoized for this evaluator's collectives and `PlacementBound`s."""
        return self.cores.get(s, links, coll, merged=merged)

    def _fp8_weight_cast_s(self, s: Strategy, stage: Stage) -> float:
        """The once-per-step fp8 cast of the stage's block weights (`Float8Linears.weight_cast_s`;
        0 unless fp8 training casts its weights once per step)."""
        sm = self.stage_model
        f8, k = sm.fp8, sm.kernels
        if f8 is None or k is None or f8.casts != Float8Casts.TRANSFORMER_ENGINE:
            return 0.0
        return f8.weight_cast_s(k, block_weight_elements(self.profile, stage, s.tp, s.ep_dp))

    def _optimizer_s(self, s: Strategy, stage: Stage) -> float:
        """`_optimizer_unscaled_s` times the calibration's refitted optimizer scale."""
        return self._optimizer_unscaled_s(s, stage) * self.optimizer_scale

    def _optimizer_unscaled_s(self, s: Strategy, stage: Stage) -> float:
        """`data_parallel.optimizer_s`; on a calibrated device with a traced model, torch's
        unfused AdamW operator by operator (`eager.unfused_adamw_s`)."""
        k = self.stage_model.kernels
        if s.offload_optimizer:
            return optimizer_s(
                s, stage, self.train, self.acc, host_s_per_param=self.host_adamw_s_per_param
            )
        if not isinstance(k, CalibratedKernels):
            return optimizer_s(s, stage, self.train, self.acc)
        tensors = stage.param_tensors
        if not tensors:
            return optimizer_s(s, stage, self.train, self.acc)
        shard = optimizer_shard_params(s, stage)
        extra = self.dtensor_adamw_tensor_s if s.dtensor_params else 0.0
        return unfused_adamw_s(shard, tensors, k, state_bytes=FP32_BYTES, dtensor_tensor_s=extra)

    def time(
        self,
        s: Strategy,
        links: Links | None = None,
        coll: Collectives | None = None,
    ) -> TimeBreakdown:
        """Step-time breakdown of the strategy: m micro-batches of the slowest stage, plus
        (pp-1)/v slots of fill and drain (Narayanan et al. 2021 §2.2), plus the once-per-step
        tail of the stage whose tail is longest."""
        stages = self.stage_times(s, links, coll)
        m = self.num_microbatches(s)
        slow = max(stages, key=lambda x: x.per_microbatch_s)
        tail = max(stages, key=lambda x: x.tail_comm_s + x.optimizer_s)
        return TimeBreakdown(
            compute_s=m * (slow.fwd_s + slow.bwd_s),
            recompute_s=m * slow.recompute_s,
            comm_s=m * slow.comm_s + tail.tail_comm_s,
            bubble_s=self.bubble_s(s, slow),
            optimizer_s=tail.optimizer_s,
        )

    def bubble_s(self, s: Strategy, slow: StageTime) -> float:
        """Fill and drain seconds: `fill_slots` slots of the slowest stage, or for the split-
        backward schedules their replayed bubble at its F:B:W (cost/schedules.py)."""
        if not split_schedules.is_split_backward(s.schedule):
            return self.fill_slots(s) * slow.per_microbatch_s
        share = slow.fwd_s / (slow.fwd_s + slow.bwd_s) if slow.fwd_s + slow.bwd_s > 0 else 0.5
        return split_schedules.bubble_s(
            s.schedule,
            pp=s.pp,
            virtual_stages=s.virtual_stages,
            num_microbatches=self.num_microbatches(s),
            forward_s=slow.per_microbatch_s * share,
            backward_s=slow.per_microbatch_s * (1 - share),
            weight_share=self.weight_share,
        )

    def fill_slots(self, s: Strategy) -> float:
        """Slots of pipeline fill and drain: (pp-1)/v (Narayanan et al. 2021 §2.2); none for
        the asynchronous pipeline, which never flushes (PipeDream-2BW, options.py); for the
        split-backward schedules their replayed bubble at F:B = 1:2 (cost/schedules.py)."""
        if split_schedules.is_split_backward(s.schedule):
            return split_schedules.fill_slots(
                s.schedule,
                pp=s.pp,
                virtual_stages=s.virtual_stages,
                num_microbatches=self.num_microbatches(s),
                weight_share=self.weight_share,
            )
        return 0.0 if s.async_pipeline else (s.pp - 1) / s.virtual_stages

    # ---- all together ----------------------------------------------------------------------
    def evaluate(self, s: Strategy) -> Estimate:
        """Predictions for a structurally valid strategy (see `violation`)."""
        rule = self.violation(s) or option_problem(s)
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
        slots = self.num_microbatches(s) + self.fill_slots(s)
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
            capacity_bytes=self.stage_model.capacity_bytes,
            bubble_fraction=self.fill_slots(s) / slots,
            exposed_comm_s=time.comm_s,
            time=time,
        )
