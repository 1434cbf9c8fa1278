"""The search's fast path for peak memory (`memory_totals`): `Evaluator.memory`'s total of
one strategy under each (sequence parallel, ZeRO stage, optimizer offload, recompute) choice,
computed together, from static totals and activations shared between the choices."""

from __future__ import annotations

from dataclasses import replace
from operator import add

from ..strategy import Recompute, Strategy
from . import schedules as split_schedules
from .evaluate import Evaluator
from .layout import Layout, Stage
from .memory import MIN_SPLIT_IN_FLIGHT, head_in_flight
from .mixed_precision import autocast_memory
from .options import has_options


def memory_totals(
    ev: Evaluator,
    s: Strategy,
    choices: tuple[tuple[bool, int, bool, Recompute], ...],
    *,
    fit_only: bool = False,
    statics: list[tuple[float, ...] | None] | None = None,
    params_follow: bool = False,
) -> list[float | None]:
    """Peak memory (`ev.memory(...)[0].total_bytes`) of `s` under each (sp, zero, offload,
    recompute) choice, computed together (with `params_follow`, ZeRO-3's optimizer offload
    offloads the parameters too, as `search_blocks.Block` builds it). A `per_layer` choice
    is None (left to the caller, as it needs the recompute solver) unless `none` fits with
    the same sharding, which makes it that strategy (not under a trainer's recompute
    pattern). With `fit_only`, a total that does not fit may be a lower bound on it (still
    above the capacity): a split-backward schedule's in-flight counts (a replay) are then
    read only for the choices that fit with `MIN_SPLIT_IN_FLIGHT` micro-batches in flight.
    With `statics`, each choice's `ev.static_totals` are appended to it (for `per_layer`,
    those of its layout, recompute none's), or None where its total does not add them up
    (options, single pass)."""
    sm, per_layer = ev.stage_model, Recompute.PER_LAYER

    def follows(zero: int, off: bool) -> bool:
        return params_follow and off and zero == 3

    def variant(sp: bool, z: int, o: bool, rc: Recompute) -> Strategy:
        return replace(
            s,
            sequence_parallel=sp,
            zero_stage=z,
            offload_optimizer=o,
            recompute=rc,
            offload_params=s.offload_params or follows(z, o),
        )

    if has_options(s) or autocast_memory(s, sm):  # terms of `memory` only
        if statics is not None:
            statics.extend([None] * len(choices))
        return [
            None if c[3] == per_layer else ev.memory(variant(*c))[0].total_bytes for c in choices
        ]
    v, dpcp = s.virtual_stages, s.dp * s.cp
    cap = sm.capacity_bytes
    lazy = fit_only and split_schedules.is_split_backward(s.schedule)
    replicate = s.dp_replicate
    acts: dict[tuple[bool, Recompute], list[float]] = {}  # lazy: at the least in flight
    exact: dict[tuple[bool, Recompute], list[float]] = {}  # lazy: as replayed
    # recompute none's total and static totals (`statics`), by (sp, zero, offload)
    nones: dict[tuple[bool, int, bool], tuple[float, tuple[float, ...] | None]] = {}
    out: list[float | None] = []
    shapes: dict[tuple[bool, Recompute], tuple[Layout, tuple[Stage, ...]]] = {}
    solved = ev.per_layer.pattern is None  # per_layer is the solver's (not a trainer's own)
    for sp, zero, off, rc in choices:
        if rc == per_layer:
            plain, static = nones.get((sp, zero, off), (None, None))
            # `none` fits: the solver keeps everything, so this is that strategy (or one
            # recomputing more where `none` fits only by the single-pass timeline); not so
            # for a trainer's own pattern, which recomputes its blocks whatever fits
            out.append(plain if solved and plain is not None and plain <= cap else None)
            if statics is not None:  # its layout is none's
                statics.append(static)
            continue
        shape = shapes.get((sp, rc))
        if shape is None:
            lay = sm.layout(s.pp, v, rc, s.tp, sp, s.schedule)
            shape = shapes[(sp, rc)] = (lay, sm.stages(lay))
        lay, stages = shape
        static = None
        if ev.single_pass(s, zero):
            total = ev.memory(variant(sp, zero, off, rc))[0].total_bytes
        else:
            static = ev.static_totals(stages, s.tp, s.ep_dp, dpcp, zero, off, replicate)
            if follows(zero, off) and s.pp == 1:
                # parameter offload moves the shards, their gradients and optimizer states
                # off the GPU without a pipeline (`offload.OffloadModel.memory`; beside one
                # they stay): what stays is the stage's other bytes
                static = tuple(
                    sm.static_memory(st, s.tp, s.ep_dp, dpcp, zero, off, replicate).other_bytes
                    for st in stages
                )
            held = acts.get((sp, rc))
            if held is None:
                held = acts[(sp, rc)] = _act_totals(ev, s, sp, rc, lay, stages, lazy)
            total = max(map(add, static, held))
            if lazy and total <= cap:  # it may fit: the replayed counts decide
                held = exact.get((sp, rc))
                if held is None:
                    held = exact[(sp, rc)] = _act_totals(ev, s, sp, rc, lay, stages, False)
                total = max(map(add, static, held))
        if statics is not None:
            statics.append(None if follows(zero, off) else static)
        if rc == Recompute.NONE:
            nones[(sp, zero, off)] = (total, static)
        out.append(total)
    return out


def _act_totals(
    ev: Evaluator,
    s: Strategy,
    sp: bool,
    rc: Recompute,
    lay: Layout,
    stages: tuple[Stage, ...],
    least: bool,
) -> list[float]:
    """Per stage of `stages`, its activations under (sp, rc) for every micro-batch in flight
    and the pipeline buffers (`memory_totals`); with `least`, a lower bound on them with
    `MIN_SPLIT_IN_FLIGHT` micro-batches in flight (split-backward schedules)."""
    sums = ev.stage_model.stage_activations(lay, s.tp, sp, s.cp, rc)
    boundary = ev.pipeline_buffer_bytes(s, sp)
    if least:
        inflight = [MIN_SPLIT_IN_FLIGHT] * len(stages)
    else:
        table = ev.in_flight(s.schedule, s.pp, ev.num_microbatches(s), s.virtual_stages)
        inflight = [table[st.index] for st in stages]
    mbs = s.micro_batch_size
    return [
        a.peak_bytes(held, mbs, head_in_flight(s.schedule, held)) + boundary
        for held, a in zip(inflight, sums, strict=True)
    ]
