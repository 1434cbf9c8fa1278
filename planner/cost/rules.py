"""Structural rules a strategy must satisfy before the cost model can price it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..strategy import MeshAxis, Schedule, Strategy

if TYPE_CHECKING:
    from .evaluate import Evaluator

_ALL_AXES = frozenset(MeshAxis)


def violation(s: Strategy, ev: Evaluator) -> str:
    """The first structural rule `s` breaks for this model, cluster and batch ('' if none)."""
    p, t, n = ev.profile, ev.train, ev.cluster.num_gpus
    if s.world_size != n:
        return (
            f"dp*tp*pp*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp} = {s.world_size} GPUs, "
            f"but the cluster has {n}"
        )
    if p.heads % s.tp or p.ffn % s.tp:
        return f"tp={s.tp} must divide heads={p.heads} and ffn={p.ffn}"
    if p.kv_heads % s.tp and s.tp % p.kv_heads:
        return f"tp={s.tp} must divide kv_heads={p.kv_heads} or be a multiple of it"
    if s.sequence_parallel and s.tp == 1:
        return "sequence_parallel needs tp > 1"
    if s.cp > 1 and t.seq_len % (2 * s.cp):
        return f"cp={s.cp} needs seq_len={t.seq_len} divisible by 2*cp (causal load balance)"
    if s.ep > 1 and not p.is_moe:
        return f"ep={s.ep} needs a mixture-of-experts model"
    if s.ep > 1 and (p.experts % s.ep or s.dp % s.ep):
        return f"ep={s.ep} must divide experts={p.experts} and dp={s.dp}"
    if s.zero_stage not in (0, 1, 2, 3):
        return f"zero_stage={s.zero_stage} must be 0, 1, 2 or 3"
    if s.offload_optimizer and s.zero_stage == 0:
        return "offload_optimizer needs zero_stage >= 1 (ZeRO-Offload partitions the states)"
    if s.micro_batch_size < 1 or t.global_batch % (s.dp * s.micro_batch_size):
        return (
            f"global_batch={t.global_batch} must be divisible by dp*micro_batch_size = "
            f"{s.dp}*{s.micro_batch_size}"
        )
    if (s.pp == 1) != (s.schedule == Schedule.NONE):
        return f"schedule={s.schedule} with pp={s.pp}: use 'none' exactly when pp=1"
    if (s.schedule == Schedule.INTERLEAVED_1F1B) != (s.virtual_stages > 1):
        return f"virtual_stages={s.virtual_stages} > 1 exactly with interleaved_1f1b"
    if s.pp * s.virtual_stages > ev.num_blocks:
        return f"pp*virtual_stages = {s.pp * s.virtual_stages} exceeds {ev.num_blocks} blocks"
    if s.schedule == Schedule.INTERLEAVED_1F1B and ev.num_microbatches(s) % s.pp:
        return (
            f"interleaved_1f1b needs the {ev.num_microbatches(s)} micro-batches to be a "
            f"multiple of pp={s.pp}"
        )
    if len(s.mesh_order) != len(MeshAxis) or set(s.mesh_order) != _ALL_AXES:
        return f"mesh_order {list(s.mesh_order)} must order each of pp, dp, cp, tp once"
    return ""
