"""The int-coded pipeline orders (`pipeline_orders.op_code`, what the replays read) are the
tuple orders `stage_order` gives (which tests/test_schedules.py checks against torch)."""

from __future__ import annotations

from paraplan.planner.solvers.pipeline_orders import PHASES, decode, op_code
from paraplan.planner.solvers.pipeline_replay import stage_order, stage_order_codes
from paraplan.planner.strategy import Schedule


def _shapes() -> list[tuple[Schedule, int, int, int]]:
    out = [(Schedule.NONE, 1, m, 1) for m in (1, 3, 8)]
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 3 * pp + 1, 4 * pp):
            out += [(Schedule.GPIPE, pp, m, 1), (Schedule.ONE_F_ONE_B, pp, m, 1)]
            out += [(Schedule.ZBV, pp, m, 2)]
            if m >= 2 * pp:  # torch's rule for DualPipeV
                out += [(Schedule.DUALPIPEV, pp, m, 2)]
            if m % pp == 0:
                out += [(Schedule.INTERLEAVED_1F1B, pp, m, v) for v in (2, 3)]
                out += [(Schedule.INTERLEAVED_ZB, pp, m, v) for v in (1, 2, 3)]
    return out


def test_codes_round_trip() -> None:
    for v in (1, 2, 3):
        ops = [(phase, mb, local) for phase in PHASES for mb in range(5) for local in range(v)]
        assert decode([op_code(*op, v) for op in ops], v) == ops


def test_stage_codes_are_the_stage_orders() -> None:
    for schedule, pp, m, v in _shapes():
        for stage in range(pp):
            kw = {"num_stages": pp, "num_microbatches": m, "virtual_stages": v, "stage": stage}
            codes = stage_order_codes(schedule, **kw)
            ops = stage_order(schedule, **kw)
            assert codes == [op_code(p, mb, local, v) for p, mb, local in ops], (schedule, kw)
