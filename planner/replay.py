"""Replay a strategy's step operation by operation and read off its step time and peak memory.

The closed form (`cost/evaluate.py`) prices a step as m micro-batches of the slowest stage plus
(pp - 1)/v slots of fill and drain, and memory with the in-flight micro-batches of
`in_flight_microbatches`. The replay runs the schedule's actual operation order on every
pipeline stage with its own per-micro-batch times (`solvers/pipeline_replay.py`): with uneven
stages the fill and drain are paid at each stage's own speed, so the replay can only be faster
than the closed form, and equal to it when the stages are alike. Memory counts, per stage, the
(micro-batch, chunk) activations alive in the replayed order. A test checks both agree.

A plan's predicted step is the replay's (`replayed`, `finalists`): the search ranks millions of
strategies by the closed form, an upper bound, and its finalists are ranked again by their
replays. On the closed loop's 2-rank CPU runs (2026-11-29) the gpt-small PP plan (embedding and
four blocks on stage 0, two blocks and the 8192-word head on stage 1) was priced 8-18% over its
measured step by the closed form, where the other plans of the same records were within a few
points of their record's common error, and 3-12% over by its replay (in line with them); the
published rows' pipelines are near-even, and their replays moved by under 1.5 points
(docs/cost-model.md §4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .cost.estimate import Estimate, Replay
from .cost.evaluate import Evaluator
from .cost.memory import MemoryBreakdown, head_in_flight
from .cost.options import has_options
from .cost.schedules import PENDING_W_ACT_FACTOR, is_split_backward
from .solvers.replay_table import replay_makespan, replay_stages
from .strategy import Strategy


def _stage_seconds(ev: Evaluator, s: Strategy) -> tuple[list[float], list[float], float]:
    """Each pipeline stage's seconds per micro-batch, forward and backward, and the step's
    tail after the last backward (its exposed communication and the optimizer step)."""
    sm = ev.stage_model
    distinct = ev.stage_times(s)
    forward, backward = [], []
    for _, rep in sm.stage_copies(sm.layout_of(s)):
        t = distinct[rep]
        share = t.fwd_s / (t.fwd_s + t.bwd_s) if t.fwd_s + t.bwd_s > 0 else 0.5
        # communication splits between the passes as the compute does; recompute runs in the
        # backward (Korthikanti et al. 2022 §5)
        forward.append(t.fwd_s + t.comm_s * share)
        backward.append(t.bwd_s + t.recompute_s + t.comm_s * (1 - share))
    tail = max(t.tail_comm_s + t.optimizer_s for t in distinct)
    return forward, backward, tail


def replay(ev: Evaluator, s: Strategy) -> Replay:
    """Replay `s` (a valid strategy) on the evaluator's model, cluster and configuration."""
    sm = ev.stage_model
    lay = sm.layout_of(s)
    copies = sm.stage_copies(lay)
    forward, backward, tail = _stage_seconds(ev, s)
    m = ev.num_microbatches(s)
    # a split backward's pending W keeps output gradients too (cost/schedules.py)
    pending = PENDING_W_ACT_FACTOR if is_split_backward(s.schedule) else 0.0
    makespan, in_flight = replay_stages(  # `simulate_pipeline`'s, without its timeline
        s.schedule,
        pp=s.pp,
        v=s.virtual_stages,
        m=m,
        forward_s=forward,
        backward_s=backward,
        share=ev.weight_share,
        pending_weight=pending,
    )
    step = makespan + tail
    if s.async_pipeline:  # PipeDream-2BW never flushes: the steady state is the step
        step = ev.time(s).step_time_s
    if ev.single_pass(s):  # the backward's layer-by-layer timeline is the replay itself
        memory, peak_stage = ev.memory(s)
        return Replay(step_time_s=step, peak_memory_bytes=memory.total_bytes, peak_stage=peak_stage)
    stages = sm.stages(lay)
    acts = sm.stage_activations(lay, s.tp, s.sequence_parallel, s.cp, ev.policy(s))
    mbs = s.micro_batch_size
    best, best_stage = -1.0, 0
    for index, (_, rep) in enumerate(copies):
        static = ev.static_memory(s, stages[rep])
        held = in_flight[index] if s.pp > 1 else 1.0
        mem = MemoryBreakdown(
            params_bytes=static.params_bytes,
            grads_bytes=static.grads_bytes,
            optimizer_bytes=static.optimizer_bytes,
            activations_bytes=acts[rep].peak_bytes(held, mbs, head_in_flight(s.schedule, held)),
            other_bytes=static.other_bytes + ev.pipeline_buffer_bytes(s),
        )
        if has_options(s):  # offload, PowerSGD's buffers, stashed weights (cost/options.py)
            mem = ev.options.memory(s, stages[rep], mem, held, ev.policy(s))
        total = mem.total_bytes
        if total > best:
            best, best_stage = total, index
    return Replay(step_time_s=step, peak_memory_bytes=best, peak_stage=best_stage)


def replayed(ev: Evaluator, e: Estimate) -> Estimate:
    """`e` with its step time from `replay` where it has a pipeline (flushed: an asynchronous
    pipeline's step is its steady state): the fill and drain at each stage's own speed. The
    time the replay saves comes off the bubble; throughput and MFU follow the step."""
    s = e.strategy
    if s.pp == 1 or s.async_pipeline:
        return e
    forward, backward, tail = _stage_seconds(ev, s)
    step = tail + replay_makespan(  # `replay`'s step, without the in-flight peaks
        s.schedule,
        pp=s.pp,
        v=s.virtual_stages,
        m=ev.num_microbatches(s),
        forward_s=forward,
        backward_s=backward,
        share=ev.weight_share,
    )
    saved = e.step_time_s - step
    if not saved > 0:  # equal stages: the closed form is the replay
        return e
    faster = e.step_time_s / step
    return dataclasses.replace(
        e,
        step_time_s=step,
        tokens_per_s=e.tokens_per_s * faster,
        mfu=e.mfu * faster,
        time=dataclasses.replace(e.time, bubble_s=max(0.0, e.time.bubble_s - saved)),
    )


def finalists(ev: Evaluator, ranked: Iterable[Estimate]) -> list[Estimate]:
    """The search's ranked strategies replayed and ranked again: those that fit first, then by
    the replayed step (a stable sort: the search's own order among equals)."""
    return sorted((replayed(ev, e) for e in ranked), key=lambda e: (not e.feasible, e.step_time_s))
