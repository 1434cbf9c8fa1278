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


def v_chunk_stage(chunk: int, pp: int) -> tuple[int, int]:
    """(stage, local chunk) of model chunk `chunk` in a V placement of 2 pp chunks
    (torch `generate_stage_to_rank_mapping(style="v")`)."""
    return (chunk, 0) if chunk < pp else (2 * pp - 1 - chunk, 1)


def interleaved_zb_order(pp: int, m: int, v: int, stage: int) -> list[Op]:
    """torch `ScheduleInterleavedZeroBubble._calculate_single_rank_operations` (its bubbles,
    the `None` entries, dropped: the replay waits on dependencies itself). Needs m % pp == 0."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + (pp - 1 - stage), m * v)
    total = m * v
    fwd_bwd = total - warmup
    cooldown = total - fwd_bwd
    # per local chunk, the operations of each phase so far (the next one's micro-batch)
    count = {F: [0] * v, Bi: [0] * v, W: [0] * v}
    cf, cb, cw = count[F], count[Bi], count[W]
    order: list[Op] = []
    add = order.append
    backward_locals: list[int] = []  # local chunk of each input gradient, in order
    done_w = 0
    for step in range(warmup + fwd_bwd + cooldown):
        if step < warmup + fwd_bwd:  # a forward (the whole of each warm-up step)
            local = (step // per_round) % v
            add((F, cf[local], local))
            cf[local] += 1
            if step < warmup:
                continue
        local = v - 1 - ((step - warmup) // per_round) % v
        add((Bi, cb[local], local))
        cb[local] += 1
        backward_locals.append(local)
        if step - warmup >= stage:  # stage s keeps s weight gradients pending
            local = backward_locals[done_w]
            add((W, cw[local], local))
            cw[local] += 1
            done_w += 1
    for local in backward_locals[done_w:]:
        add((W, cw[local], local))
        cw[local] += 1
    return order


def zbv_order(pp: int, m: int, stage: int) -> list[Op]:
    """torch `ScheduleZBVZeroBubble._calculate_single_rank_operations`: chunk 0 is the V's
    descending arm (model chunk `stage`), chunk 1 the ascending one (2 pp - 1 - stage)."""
    n = max(2 * pp - 1, m)
    f0 = f1 = b0 = b1 = 0
    order: list[Op] = []
    for _ in range(2 * (pp - stage) - 1):
        order.append((F, f0, 0))
        f0 += 1
    for _ in range(stage):
        order += [(F, f1, 1), (F, f0, 0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - stage):
        order += [(F, f1, 1), (Bi, b1, 1), (W, b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            order.append((F, f0, 0))
            f0 += 1
        order += [(Bi, b0, 0), (W, b0, 0), (F, f1, 1), (Bi, b1, 1), (W, b1, 1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(stage):
        order += [(Bi, b0, 0), (Bi, b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - stage):
        order += [(Bi, b0, 0), (W, w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    order += [(W, k, 1) for k in range(w1, b1)]
    order += [(W, k, 0) for k in range(w0, b0)]
    return [op for op in order if op[1] < m]


def dualpipev_order(pp: int, m: int, stage: int) -> list[Op]:
    """torch `ScheduleDualPipeV._calculate_single_rank_operations`, an overlapped F&B pair
    written as its forward then its full backward. Needs m >= 2 pp."""
    fwd = [0, 0]  # per local chunk: forwards so far
    bwd = [0, 0]  # per local chunk: backwards so far, whole (B) or input gradient (Bi)
    pending_w: deque[tuple[int, int]] = deque()  # (local chunk, micro-batch) whose W waits
    order: list[Op] = []
    add = order.append

    def back(phase: Phase, local: int) -> None:
        k = bwd[local]
        bwd[local] = k + 1
        add((phase, k, local))
        if phase == Bi:
            pending_w.append((local, k))

    def add_w() -> None:
        if pending_w:
            local, k = pending_w.popleft()
            add((W, k, local))

    r = stage
    for _ in range((pp - r - 1) * 2):
        add((F, fwd[0], 0))
        fwd[0] += 1
    for _ in range(r + 1):
        add((F, fwd[0], 0))
        add((F, fwd[1], 1))
        fwd[0] += 1
        fwd[1] += 1
    for _ in range(pp - r - 1):
        back(Bi, 1)
        add_w()
        add((F, fwd[1], 1))
        fwd[1] += 1
    for _ in range(m - 2 * pp + r + 1):
        # with the last stage's first step not overlapped, the same order
        add((F, fwd[0], 0))
        add((B, bwd[1], 1))
        add((F, fwd[1], 1))
        add((B, bwd[0], 0))
        fwd[0] += 1
        fwd[1] += 1
        bwd[0] += 1
        bwd[1] += 1
    for _ in range(pp - r - 1):
        add((B, bwd[1], 1))
        add((F, fwd[1], 1))
        add((B, bwd[0], 0))
        fwd[1] += 1
        bwd[0] += 1
        bwd[1] += 1
    zb = False
    steps = r + 1
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            zb = True
        back(Bi if zb else B, 1)
        if i == steps // 2 and r % 2 == 0:
            zb = True
        back(Bi if zb else B, 0)
    for _ in range(pp - r - 1):
        add_w()
        back(Bi if zb else B, 0)
    for _ in range(r + 1):
        add_w()
    return order
