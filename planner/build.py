"""From the search's estimates to a `Plan`: layer ranges, decisions, runners-up with reasons."""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster
from .config import TrainConfig
from .cost.count_split import CountSplit
from .cost.evaluate import Estimate, Evaluator
from .cost.layout import StageSplit
from .cost.recompute_pattern import RecomputePattern
from .model import LayerKind, ModelProfile, attention_windows, dense_blocks
from .options import hidden_costs
from .plan import (
    SCHEMA_VERSION,
    ChunkRange,
    ClusterInfo,
    LayerDecision,
    Mesh,
    ModelInfo,
    Parallelism,
    Plan,
    Predicted,
    RunnerUp,
    StagePlan,
    TrainInfo,
)
from .replay import replay
from .strategy import Strategy
from .units import gib, seconds

GENERATOR = "paraplan 0.1.0"

_CAUSES = {
    "compute_s": "more compute per GPU",
    "recompute_s": "more recomputation",
    "comm_s": "more exposed communication",
    "bubble_s": "a larger pipeline bubble",
    "optimizer_s": "a slower optimizer step",
}


def parallelism_of(s: Strategy) -> Parallelism:
    """The plan's parallelism record of a strategy."""
    return Parallelism(
        dp=s.dp,
        tp=s.tp,
        pp=s.pp,
        cp=s.cp,
        ep=s.ep,
        expert_tp=1 if s.folded_experts else s.tp,
        zero_stage=s.zero_stage,
        dp_shard=s.shard_dp,
        sequence_parallel=s.sequence_parallel,
        virtual_stages=s.virtual_stages,
        offload_optimizer=s.offload_optimizer,
        powersgd_rank=s.powersgd_rank,
        offload_params=s.offload_params,
        offload_activations=s.offload_activations,
        async_pipeline=s.async_pipeline,
    )


def lost_because(loser: Estimate, winner: Estimate) -> str:
    """Why `loser` ranks below `winner`, in words."""
    if not loser.feasible:
        return f"does not fit: {loser.reason}"
    gap = loser.step_time_s - winner.step_time_s
    if gap <= 0:
        if loser.memory.total_bytes > winner.memory.total_bytes:
            extra = loser.memory.total_bytes - winner.memory.total_bytes
            return f"as fast, but needs {gib(extra)} more per GPU"
        return (
            "equivalent under the cost model (same time and memory); the plan is preferred as "
            "the simpler strategy (smaller tp, pp, cp first)"
        )
    diffs = {name: getattr(loser.time, name) - getattr(winner.time, name) for name in _CAUSES}
    cause = max(diffs, key=lambda k: diffs[k])
    return (
        f"{gap / winner.step_time_s:.1%} slower ({seconds(loser.step_time_s)} vs "
        f"{seconds(winner.step_time_s)} per step), mostly {_CAUSES[cause]} "
        f"({seconds(diffs[cause], sign=True)})"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanContext:
    """What a plan is made for."""

    profile: ModelProfile
    """The model."""
    cluster: Cluster
    """The cluster."""
    train: TrainConfig
    """The training configuration."""
    split: StageSplit | CountSplit = StageSplit.BALANCED
    """How the blocks are split over pipeline chunks (`Evaluator`'s)."""
    pattern: RecomputePattern | None = None
    """A trainer's own blocks to recompute under `per_layer` (`Evaluator`'s)."""


def build_plan(ctx: PlanContext, chosen: Estimate, runners_up: tuple[Estimate, ...]) -> Plan:
    """The plan for `chosen`, listing `runners_up` with why each lost."""
    p, c, t = ctx.profile, ctx.cluster, ctx.train
    s = chosen.strategy
    ev = Evaluator(p, c, t, ctx.split, ctx.pattern)
    chunks = ev.stage_model.chunks(ev.stage_model.layout_of(s))
    stages = tuple(
        StagePlan(
            stage=st,
            chunks=tuple(
                ChunkRange(chunk=ch.index, first_layer=ch.first_layer, last_layer=ch.last_layer)
                for ch in chunks
                if ch.stage == st
            ),
        )
        for st in range(s.pp)
    )
    layers = tuple(
        LayerDecision(
            index=i,
            name=x.name,
            recompute=policy,
            kept_bytes=kept,
            recompute_s=seconds,
            offload_activations=s.offload_activations and x.kind == LayerKind.BLOCK,
        )
        for i, (x, (policy, kept, seconds)) in enumerate(
            zip(p.layers, ev.per_layer.decisions(s), strict=True)
        )
    )
    mem, tb = chosen.memory, chosen.time
    return Plan(
        schema_version=SCHEMA_VERSION,
        generator=GENERATOR,
        model=ModelInfo(
            name=p.name,
            fingerprint=p.fingerprint(),
            num_params=p.num_params,
            num_blocks=p.decoder_blocks,
            hidden=p.hidden,
            heads=p.heads,
            kv_heads=p.kv_heads,
            vocab=p.vocab,
            experts=p.experts,
            module_digest=p.module_digest,
            head_dim=p.head_dim,
            ffn=p.ffn,
            gated_mlp=p.gated_mlp,
            top_k=p.top_k if p.experts else 0,
            tied_embeddings=p.tied_embeddings,
            attention_windows=attention_windows(p),
            dense_blocks=dense_blocks(p),
            dense_ffn=p.dense_ffn,
            shared_expert_ffn=p.shared_expert_ffn,
            latent_attention=p.latent_attention,
            routing_groups=p.routing_groups,
            routing_group_top_k=p.routing_group_top_k,
        ),
        cluster=ClusterInfo(
            name=c.name,
            fingerprint=c.fingerprint(),
            accelerator=c.accelerator.name,
            num_nodes=c.num_nodes,
            gpus_per_node=c.gpus_per_node,
            num_gpus=c.num_gpus,
        ),
        train=TrainInfo(
            global_batch=t.global_batch,
            seq_len=t.seq_len,
            precision=t.precision,
            optimizer=t.optimizer,
            memory_headroom=t.memory_headroom,
            runtime=t.runtime,
            mtp_layers=p.mtp_blocks,
        ),
        parallelism=parallelism_of(s),
        mesh=Mesh(
            axis_order=s.mesh_order,
            shape=tuple(s.axis_size(a) for a in s.mesh_order),
        ),
        schedule=s.schedule,
        micro_batch_size=s.micro_batch_size,
        num_microbatches=chosen.num_microbatches,
        stages=stages,
        recompute_policy=s.recompute,
        layers=layers,
        feasible=chosen.feasible,
        infeasible_reason=chosen.reason,
        predicted=Predicted(
            step_time_s=chosen.step_time_s,
            tokens_per_s=chosen.tokens_per_s,
            mfu=chosen.mfu,
            model_flops_per_s_per_gpu=(
                ev.model_flops_per_seq * t.global_batch / (chosen.step_time_s * c.num_gpus)
            ),
            memory_per_gpu_bytes=mem.total_bytes,
            memory_capacity_bytes=chosen.capacity_bytes,
            peak_stage=chosen.peak_stage,
            memory_breakdown=mem,
            time_breakdown=tb,
            bubble_fraction=chosen.bubble_fraction,
            exposed_comm_s=chosen.exposed_comm_s,
            recompute_saved_bytes=ev.recompute_saved_bytes(s),
            replay=replay(ev, s),
            hidden_costs=hidden_costs(ev, s),
        ),
        runners_up=tuple(
            RunnerUp(
                parallelism=parallelism_of(r.strategy),
                schedule=r.strategy.schedule,
                micro_batch_size=r.strategy.micro_batch_size,
                recompute=r.strategy.recompute,
                mesh_axis_order=r.strategy.mesh_order,
                step_time_s=r.step_time_s,
                tokens_per_s=r.tokens_per_s,
                mfu=r.mfu,
                memory_per_gpu_bytes=r.memory.total_bytes,
                lost_because=lost_because(r, chosen),
            )
            for r in runners_up
        ),
    )
