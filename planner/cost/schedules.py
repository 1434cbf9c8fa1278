"""Bubble and in-flight terms of the split-backward schedules (zero bubble, DualPipeV).

These schedules run a backward as an input gradient B (which the previous stage waits for) and
a weight gradient W (which nobody waits for) (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism", arXiv 2401.10241, §2). Their fill and drain depend on how F, B and W compare,
and the papers state them only for particular ratios:

- ZB-H1 / ZB1P (`interleaved_zb`): bubble (p-1)(T_F + T_B - T_W) (Qi et al. §2.1, Fig. 3
  top; DeepSeek-V3 Table 2 writes it (PP-1)(F + B - 2W) with B the full backward), a third of
  1F1B's (p-1)(T_F + T_B + T_W) when the three are equal.
- ZB-V (`zbv`): no idle time inside any stage's own span when T_F = T_B = T_W (Qi et al. §6;
  the authors' table "Bubble Rate 0"); the last stage still starts (p-1) chunk forwards late
  and the first ends that much early, which only their optimizer post-validation hides. torch
  and paraplan step the optimizer after the whole schedule, so the step pays it.
- DualPipeV (`dualpipev`): (PP/2 - 1)(F&B + B - 3W) for PP chunks (DeepSeek-V3 Table 2,
  arXiv 2412.19437; DualPipe README for the V variant), with F&B = F + B when forward and
  backward are not overlapped (torch's default).

For any ratio the exact value is that of torch's own operation order, which
`solvers/pipeline_replay.py` replays; with m >= 2p micro-batches it no longer depends on m
(tests/test_schedules.py checks this and the papers' formulas). So the cost model prices the
fill and drain of these schedules by replaying equal stages with min(m, 2p) micro-batches,
cached by (schedule, p, v, m, F:B:W rounded to 1e-3).

Memory: a micro-batch keeps its activations until its W ran (W reads the inputs of the
weight GEMMs) and, between its B and its W, also the gradients of the GEMM outputs that W
reads. For a transformer block those gradients are 18 sbh bytes against the 34 sbh of its
activations in 16-bit (Korthikanti et al. 2022 Table 2 terms: QKV 6, projection 2, FC1 8,
FC2 2 sbh), so a pending W counts `PENDING_W_ACT_FACTOR` = 18/34 of a micro-batch more.
"""

from __future__ import annotations

from functools import lru_cache

from .. import replay_store
from ..model import ModelProfile
from ..solvers.pipeline_replay import SPLIT_BACKWARD, makespan_s
from ..solvers.replay_table import (
    RATIO_DIGITS,
    Path,
    in_flight_peaks,
    makespan_at,
    makespan_bound,
)
from ..strategy import Schedule

PENDING_W_ACT_FACTOR = 18.0 / 34.0
"""Output-gradient bytes a pending weight gradient keeps, per byte of the micro-batch's
activations (Korthikanti et al. 2022 Table 2: 18 sbh of GEMM output gradients, 34 sbh)."""

DEFAULT_WEIGHT_SHARE = 0.5
"""Share of a backward that is the weight gradient when nothing better is known: each GEMM's
backward is one input-gradient and one weight-gradient GEMM of equal FLOPs (Narayanan et al.
2021 §3.3's 2x forward)."""

_RATIO_DIGITS = RATIO_DIGITS


def is_split_backward(schedule: Schedule) -> bool:
    """Whether the schedule splits backwards into B and W (the terms of this module apply)."""
    return schedule in SPLIT_BACKWARD


def weight_grad_share(profile: ModelProfile) -> float:
    """Share of the model's backward FLOPs that is weight gradients: every forward FLOP but the
    attention core (QK^T, AV: no weights) is a GEMM with a weight, whose weight gradient costs
    its forward FLOPs again."""
    fwd = sum(x.fwd_flops - x.attn_core_fwd_flops for x in profile.layers)
    bwd = sum(x.bwd_flops for x in profile.layers)
    if bwd <= 0:
        return DEFAULT_WEIGHT_SHARE
    return min(1.0, max(0.0, fwd / bwd))


def _reference_m(schedule: Schedule, pp: int, m: int) -> int:
    """The micro-batches replayed: min(m, 2p), past which nothing changes. Counts torch
    refuses (rules.py rejects those strategies before they are ranked) replay the nearest
    count it accepts, so that pricing never fails: 2p for DualPipeV, p for ZB1P off a
    multiple of p."""
    if schedule == Schedule.DUALPIPEV:
        return 2 * pp
    if schedule == Schedule.INTERLEAVED_ZB:
        return 2 * pp if m >= 2 * pp else pp
    return min(m, 2 * pp)


@lru_cache(maxsize=4096)
def _replayed(
    schedule: Schedule, pp: int, v: int, m: int, f: float, b: float, share: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each stage's in-flight peak, without and with the pending weight gradients' share."""
    held = in_flight_peaks(schedule, pp, v, m, f, b, share, 0.0)
    pending = in_flight_peaks(schedule, pp, v, m, f, b, share, PENDING_W_ACT_FACTOR)
    return held, pending


@lru_cache(maxsize=16384)
def _unit_bubble(
    schedule: Schedule, pp: int, v: int, m: int, f: float, b: float, share: float
) -> float:
    """The replayed bubble, from the makespan alone (bit for bit `simulate_pipeline`'s):
    read from a table of rounded shares (`solvers/replay_table.py`) when `f` is one, or from
    an earlier run's (`replay_store.py`)."""
    args = (v, m, f, b, share)
    known = replay_store.STORE.get("bubble", schedule, pp, args)
    if isinstance(known, float):
        return known
    span = makespan_at(schedule, pp=pp, v=v, m=m, forward=f, share=share) if b == 1.0 - f else None
    if span is None:
        span = makespan_s(
            schedule,
            num_stages=pp,
            num_microbatches=m,
            forward_s=f,
            backward_s=b,
            virtual_stages=v,
            weight_share=share,
        )
    bubble = span - m * (f + b)
    replay_store.STORE.put("bubble", schedule, pp, args, bubble)
    return bubble


def bubble_s(
    schedule: Schedule,
    *,
    pp: int,
    virtual_stages: int,
    num_microbatches: int,
    forward_s: float,
    backward_s: float,
    weight_share: float,
) -> float:
    """Fill and drain seconds of a split-backward schedule with equal stages, each running a
    micro-batch's forward in `forward_s` and its backward in `backward_s` (see the module
    docstring)."""
    total = forward_s + backward_s
    if total <= 0:
        return 0.0
    f, share, m = _unit_shape(schedule, pp, num_microbatches, forward_s / total, weight_share)
    unit_bubble = _unit_bubble(schedule, pp, virtual_stages, m, f, 1.0 - f, share)
    return max(0.0, unit_bubble) * total


def bubble_bound_s(
    schedule: Schedule,
    *,
    pp: int,
    virtual_stages: int,
    num_microbatches: int,
    forward_s: float,
    backward_s: float,
    weight_share: float,
) -> float:
    """A lower bound on `bubble_s`, without a replay (for the search's bounds): the makespan
    is at least the length of `fill_chain`."""
    total = forward_s + backward_s
    if total <= 0:
        return 0.0
    f, share, m = _unit_shape(schedule, pp, num_microbatches, forward_s / total, weight_share)
    chain = fill_chain(pp, virtual_stages, m)
    span = makespan_bound([chain], v=virtual_stages, forward=f, share=share)
    return max(0.0, span - m * (f + (1.0 - f))) * total


def _unit_shape(
    schedule: Schedule, pp: int, num_microbatches: int, forward_share: float, weight_share: float
) -> tuple[float, float, int]:
    """(forward share, weight-gradient share, micro-batches) a unit replay is keyed by: the
    shares rounded to `_RATIO_DIGITS`, the micro-batches at their reference count."""
    return (
        round(forward_share, _RATIO_DIGITS),
        round(weight_share, _RATIO_DIGITS),
        _reference_m(schedule, pp, num_microbatches),
    )


def fill_chain(pp: int, v: int, m: int) -> Path:
    """A chain of operations the graph of every split-backward schedule holds (replayed with
    m micro-batches of v chunks per stage): the first micro-batch's forward through the
    chunks of the first pp - 1 stages, then everything the last stage runs (its first
    operation waits for that forward), as operations per phase (`replay_table.Path`; a
    backward split in two counted whole: same seconds). Its length less the micro-batches'
    work is (pp - 1) forward chunks, the fill of ZB-H1 and the zero-bubble schedules."""
    return (pp - 1 + m * v, m * v, 0, 0)


def fill_slots(
    schedule: Schedule, *, pp: int, virtual_stages: int, num_microbatches: int, weight_share: float
) -> float:
    """`bubble_s` in slots of one micro-batch's forward and backward, for the F:B ratio of 1:2
    (backward twice the forward, Narayanan et al. 2021 §3.3)."""
    return bubble_s(
        schedule,
        pp=pp,
        virtual_stages=virtual_stages,
        num_microbatches=num_microbatches,
        forward_s=1.0 / 3.0,
        backward_s=2.0 / 3.0,
        weight_share=weight_share,
    )


def in_flight_microbatches(
    schedule: Schedule,
    *,
    pp: int,
    stage: int,
    num_microbatches: int,
    virtual_stages: int,
    weight_share: float = DEFAULT_WEIGHT_SHARE,
) -> float:
    """Micro-batches' worth of activations a stage holds at its peak, in units of the whole
    stage, counting each pending weight gradient `PENDING_W_ACT_FACTOR` more (the replayed
    torch order with m' = min(m, 2p): the peak no longer grows past it)."""
    m = _reference_m(schedule, pp, num_microbatches)
    share = round(weight_share, _RATIO_DIGITS)
    f, b = 1.0 / 3.0, 2.0 / 3.0  # `_replayed`'s second half, without its first
    pending = in_flight_peaks(schedule, pp, virtual_stages, m, f, b, share, PENDING_W_ACT_FACTOR)
    return pending[stage]


def pending_w_share(
    schedule: Schedule,
    *,
    pp: int,
    stage: int,
    num_microbatches: int,
    virtual_stages: int,
    weight_share: float = DEFAULT_WEIGHT_SHARE,
) -> float:
    """Share of `stage`'s in-flight activation memory at its peak that the split backward
    adds: the GEMM output gradients of micro-batches whose W has not run yet
    (`PENDING_W_ACT_FACTOR`), as `in_flight_microbatches` prices them; 0 for other schedules."""
    if not is_split_backward(schedule):
        return 0.0
    m = _reference_m(schedule, pp, num_microbatches)
    share = round(weight_share, _RATIO_DIGITS)
    held, pending = _replayed(schedule, pp, virtual_stages, m, 1.0 / 3.0, 2.0 / 3.0, share)
    return max(0.0, pending[stage] - held[stage]) / pending[stage] if pending[stage] else 0.0
