"""Per-stage operation orders of the zero-bubble and bidirectional pipeline schedules.

These schedules split a backward into the input gradient (B, which the previous stage waits
for) and the weight gradient (W, which nobody waits for, so it fills bubbles) (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §2). The orders are those torch 2.13's
`torch.distributed.pipelining.schedules` runs, ported operation by operation (the planner
stays free of torch; tests/test_schedules.py checks every order against torch's
`_calculate_single_rank_operations` for many (pp, m)):

- `interleaved_zb` (`ScheduleInterleavedZeroBubble`, ZB1P/ZB-H1 of the paper, §3.1, with v
  chunks per stage placed in a loop as interleaved 1F1B): 1F1B's warm-up, then each step one
  F and one B; stage s defers its W by s steps, the rest trail at the end.
- `zbv` (`ScheduleZBVZeroBubble`, ZB-V, the paper's §6 / Qi et al. 2024 "Pipeline Parallelism
  with Controllable Memory", arXiv 2405.15362): two chunks per stage in a V (chunk c on stage c
  for c < pp, on 2 pp - 1 - c after), so stage 0 holds the first and the last chunk.
- `dualpipev` (`ScheduleDualPipeV`, the "cut in half" DualPipe of DeepSeek-V3, arXiv
  2412.19437 §3.2.1, github.com/deepseek-ai/DualPipe): V placement; in the steady state each
  step runs a forward of one chunk together with the full backward of the other (torch runs the
  pair one after the other unless a custom overlap function is registered, so this replay
  charges both); the last micro-batches split B and W again.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

from ..strategy import Schedule


class Phase(StrEnum):
    """What an interval computes."""

    FORWARD = "forward"
    BACKWARD = "backward"
    """The whole backward (input and weight gradients)."""
    BACKWARD_INPUT = "backward_input"
    """Input gradient only (zero-bubble B)."""
    BACKWARD_WEIGHT = "backward_weight"
    """Weight gradient only (zero-bubble W), run later from the kept inputs and output grads."""


Op = tuple[Phase, int, int]
"""(phase, micro-batch, local chunk 0..v-1) of one stage."""

F, B, Bi, W = Phase.FORWARD, Phase.BACKWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT
PHASES = (F, B, Bi, W)
"""Each phase by its row, the low two bits of an `op_code`."""
_F, _B, _BI, _W = range(4)
"""Rows of `PHASES`."""


def op_code(phase: Phase, mb: int, local: int, v: int) -> int:
    """One operation as an int, `(mb * v + local) * 4 + row of its phase`: the replays read
    orders of ints (no tuple per operation: hundreds of thousands of them at large pp would
    wake Python's cyclic garbage collector)."""
    return (mb * v + local) << 2 | PHASES.index(phase)


def decode(codes: list[int], v: int) -> list[Op]:
    """The (phase, micro-batch, local chunk) operations of `op_code`s."""
    return [(PHASES[c & 3], (c >> 2) // v, (c >> 2) % v) for c in codes]


def v_chunk_stage(chunk: int, pp: int) -> tuple[int, int]:
    """(stage, local chunk) of model chunk `chunk` in a V placement of 2 pp chunks
    (torch `generate_stage_to_rank_mapping(style="v")`)."""
    return (chunk, 0) if chunk < pp else (2 * pp - 1 - chunk, 1)


def interleaved_zb_codes(pp: int, m: int, v: int, stage: int) -> list[int]:
    """torch `ScheduleInterleavedZeroBubble._calculate_single_rank_operations` (its bubbles,
    the `None` entries, dropped: the replay waits on dependencies itself), as `op_code`s.
    Needs m % pp == 0."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + (pp - 1 - stage), m * v)
    total = m * v
    fwd_bwd = total - warmup
    cooldown = total - fwd_bwd
    # per local chunk, the operations of each phase so far (the next one's micro-batch)
    cf, cb, cw = [0] * v, [0] * v, [0] * v
    order: list[int] = []
    add = order.append
    backward_locals: list[int] = []  # local chunk of each input gradient, in order
    done_w = 0
    for step in range(warmup + fwd_bwd + cooldown):
        if step < warmup + fwd_bwd:  # a forward (the whole of each warm-up step)
            local = (step // per_round) % v
            add((cf[local] * v + local) << 2)  # op_code(F, ...)
            cf[local] += 1
            if step < warmup:
                continue
        local = v - 1 - ((step - warmup) // per_round) % v
        add((cb[local] * v + local) << 2 | _BI)
        cb[local] += 1
        backward_locals.append(local)
        if step - warmup >= stage:  # stage s keeps s weight gradients pending
            local = backward_locals[done_w]
            add((cw[local] * v + local) << 2 | _W)
            cw[local] += 1
            done_w += 1
    for local in backward_locals[done_w:]:
        add((cw[local] * v + local) << 2 | _W)
        cw[local] += 1
    return order


def zbv_codes(pp: int, m: int, stage: int) -> list[int]:
    """torch `ScheduleZBVZeroBubble._calculate_single_rank_operations`, as `op_code`s (v = 2):
    chunk 0 is the V's descending arm (model chunk `stage`), chunk 1 the ascending one
    (2 pp - 1 - stage)."""
    n = max(2 * pp - 1, m)
    f0 = f1 = b0 = b1 = 0
    # op_code(phase, mb, local) with v = 2 is 8 mb + 4 local + row
    f_0, f_1, bi_0, bi_1, w_0, w_1 = _F, 4 | _F, _BI, 4 | _BI, _W, 4 | _W
    order: list[int] = []
    for _ in range(2 * (pp - stage) - 1):
        order.append(8 * f0 + f_0)
        f0 += 1
    for _ in range(stage):
        order += [8 * f1 + f_1, 8 * f0 + f_0]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - stage):
        order += [8 * f1 + f_1, 8 * b1 + bi_1, 8 * b1 + w_1]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            order.append(8 * f0 + f_0)
            f0 += 1
        order += [8 * b0 + bi_0, 8 * b0 + w_0, 8 * f1 + f_1, 8 * b1 + bi_1, 8 * b1 + w_1]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(stage):
        order += [8 * b0 + bi_0, 8 * b1 + bi_1]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - stage):
        order += [8 * b0 + bi_0, 8 * w0 + w_0]
        b0, w0 = b0 + 1, w0 + 1
    order += [8 * k + w_1 for k in range(w1, b1)]
    order += [8 * k + w_0 for k in range(w0, b0)]
    return [code for code in order if code < 8 * m]  # micro-batches below m


def dualpipev_codes(pp: int, m: int, stage: int) -> list[int]:
    """torch `ScheduleDualPipeV._calculate_single_rank_operations`, an overlapped F&B pair
    written as its forward then its full backward, as `op_code`s (v = 2). Needs m >= 2 pp."""
    fwd = [0, 0]  # per local chunk: forwards so far
    bwd = [0, 0]  # per local chunk: backwards so far, whole (B) or input gradient (Bi)
    pending_w: deque[int] = deque()  # 2 micro-batch + local chunk of each W that waits
    order: list[int] = []
    add = order.append

    def back(row: int, local: int) -> None:
        k = bwd[local]
        bwd[local] = k + 1
        add(8 * k + 4 * local + row)
        if row == _BI:
            pending_w.append(2 * k + local)

    def add_w() -> None:
        if pending_w:
            add(4 * pending_w.popleft() + _W)

    def forward(local: int) -> None:
        add(8 * fwd[local] + 4 * local)
        fwd[local] += 1

    r = stage
    for _ in range((pp - r - 1) * 2):
        forward(0)
    for _ in range(r + 1):
        forward(0)
        forward(1)
    for _ in range(pp - r - 1):
        back(_BI, 1)
        add_w()
        forward(1)
    for _ in range(m - 2 * pp + r + 1):
        # with the last stage's first step not overlapped, the same order
        f0, f1, b0, b1 = fwd[0], fwd[1], bwd[0], bwd[1]
        order += [8 * f0, 8 * b1 + 4 + _B, 8 * f1 + 4, 8 * b0 + _B]
        fwd[0], fwd[1], bwd[0], bwd[1] = f0 + 1, f1 + 1, b0 + 1, b1 + 1
    for _ in range(pp - r - 1):
        f1, b0, b1 = fwd[1], bwd[0], bwd[1]
        order += [8 * b1 + 4 + _B, 8 * f1 + 4, 8 * b0 + _B]
        fwd[1], bwd[0], bwd[1] = f1 + 1, b0 + 1, b1 + 1
    zb = False
    steps = r + 1
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            zb = True
        back(_BI if zb else _B, 1)
        if i == steps // 2 and r % 2 == 0:
            zb = True
        back(_BI if zb else _B, 0)
    for _ in range(pp - r - 1):
        add_w()
        back(_BI if zb else _B, 0)
    for _ in range(r + 1):
        add_w()
    return order


def interleaved_zb_order(pp: int, m: int, v: int, stage: int) -> list[Op]:
    """`interleaved_zb_codes` as (phase, micro-batch, local chunk) operations."""
    return decode(interleaved_zb_codes(pp, m, v, stage), v)


def zbv_order(pp: int, m: int, stage: int) -> list[Op]:
    """`zbv_codes` as (phase, micro-batch, local chunk) operations."""
    return decode(zbv_codes(pp, m, stage), 2)


def dualpipev_order(pp: int, m: int, stage: int) -> list[Op]:
    """`dualpipev_codes` as (phase, micro-batch, local chunk) operations."""
    return decode(dualpipev_codes(pp, m, stage), 2)


def stage_codes(schedule: Schedule, pp: int, m: int, v: int, stage: int) -> list[int]:
    """The `op_code`s `stage` runs, in order (`pipeline_replay.stage_order`, which checks the
    arguments, decodes them)."""
    s = stage
    if schedule in (Schedule.NONE, Schedule.GPIPE):  # v = 1: op_code is 4 mb + row
        if schedule == Schedule.NONE:
            return [4 * i + row for i in range(m) for row in (_F, _B)]
        return [4 * i for i in range(m)] + [4 * i + _B for i in range(m)]
    if schedule == Schedule.ONE_F_ONE_B:
        warmup = min(pp - s - 1, m)
        order = [4 * i for i in range(warmup)]
        for k in range(m - warmup):
            order += [4 * (warmup + k), 4 * k + _B]
        return order + [4 * k + _B for k in range(m - warmup, m)]
    if schedule == Schedule.INTERLEAVED_ZB:
        return interleaved_zb_codes(pp, m, v, s)
    if schedule == Schedule.ZBV:
        return zbv_codes(pp, m, s)
    if schedule == Schedule.DUALPIPEV:
        return dualpipev_codes(pp, m, s)

    def virtual(k: int, backward: bool) -> int:  # interleaved 1F1B (pipeline_replay.py)
        local = (k // pp) % v
        mb = (k // (pp * v)) * pp + k % pp
        return (mb * v + v - 1 - local) << 2 | _B if backward else (mb * v + local) << 2

    total = m * v
    warmup = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    order = [virtual(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        order += [virtual(warmup + k, False), virtual(k, True)]
    return order + [virtual(k, True) for k in range(total - warmup, total)]
