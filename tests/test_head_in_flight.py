"""Under interleaved 1F1B the last stage holds the head's activations for one micro-batch, not for
the stage's in-flight count: its last chunk (where the head and loss sit) runs each micro-batch's
forward right before its backward. The judge is torch's own `ScheduleInterleaved1F1B` order
(`_calculate_single_rank_operations`), replayed chunk by chunk: the peak of the bytes it holds,
chunks of equal activations and a head on the last, against the planner's accounting
(`in_flight_microbatches`, `head_in_flight`, `StageActivations.peak_bytes`). Before, the head
was held as often as the whole stage, (v - 1) pp / v + 1/v times: a 128k-vocabulary head's
fp32 log-probabilities 13.9 times over on the last of 16 stages with v = 7."""

from __future__ import annotations

import pytest

from paraplan.planner.cost.memory import head_in_flight, in_flight_microbatches
from paraplan.planner.cost.stage_parts import StageActivations
from paraplan.planner.strategy import Schedule

CHUNK_BYTES = 100.0
"""Activations one micro-batch keeps in each chunk of a stage (per sequence)."""
HEAD_BYTES = 1000.0
"""The head's on top, in the last stage's last chunk: ten chunks' worth."""


def _torch_order(pp: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's interleaved 1F1B order for one rank as (kind, micro-batch, local chunk), without
    building stages or a process group (chunk c of rank r is stage c * pp + r)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    o = object.__new__(schedules.ScheduleInterleaved1F1B)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = pp, m, v
    o.number_of_rounds = max(1, m // pp)
    o.microbatches_per_round = m // o.number_of_rounds
    o.num_stages = o._num_stages = pp * v
    return [
        (str(a.computation_type.value), a.microbatch_index, a.stage_index // pp)
        for a in o._calculate_single_rank_operations(rank)
        if a is not None
    ]


def _replayed_peak(pp: int, m: int, v: int, rank: int, head: float) -> float:
    """The most bytes the rank holds at once in torch's order: each forward keeps its chunk's
    activations (the last chunk of the last rank also the head's) until that chunk's backward."""
    held = [0] * v
    weight = [CHUNK_BYTES] * v
    if rank == pp - 1:
        weight[-1] += head
    peak = 0.0
    for kind, _, chunk in _torch_order(pp, m, v, rank):
        held[chunk] += 1 if kind == "F" else -1 if kind == "B" else 0
        peak = max(peak, sum(h * w for h, w in zip(held, weight, strict=True)))
    return peak


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 4)])
def test_last_stage_holds_one_micro_batch_of_the_head(pp: int, m: int, v: int) -> None:
    """For every rank, the planner's activations at the peak equal the replay of torch's order
    (so the in-flight count itself is checked on every stage too); on the last stage the
    accounting before (the head held as often as the stage) was over by the head times the
    in-flight count less one."""
    schedule = Schedule.INTERLEAVED_1F1B
    for rank in range(pp):
        inflight = in_flight_microbatches(
            schedule, pp=pp, stage=rank, num_microbatches=m, virtual_stages=v
        )
        head = HEAD_BYTES if rank == pp - 1 else 0.0
        acts = StageActivations(
            kept_bytes=v * CHUNK_BYTES + head, transient_bytes=0.0, head_kept_bytes=head
        )
        replayed = _replayed_peak(pp, m, v, rank, head)
        assert acts.peak_bytes(inflight, 1, head_in_flight(schedule, inflight)) == pytest.approx(
            replayed
        )
        before = acts.peak_bytes(inflight, 1)
        assert before - replayed == pytest.approx(head * (inflight - 1))
        assert rank < pp - 1 or inflight > 1  # the last stage's count is above one here


def test_other_schedules_hold_the_head_with_the_stage() -> None:
    """1F1B's last stage holds one micro-batch anyway, GPipe's all of them: the head's count is
    the stage's."""
    assert head_in_flight(Schedule.ONE_F_ONE_B, 1.0) == 1.0
    assert head_in_flight(Schedule.GPIPE, 8.0) == 8.0
    assert head_in_flight(Schedule.INTERLEAVED_1F1B, 25.0 / 4) == 1.0
