"""Zero-bubble pipelines on gloo against the single-process reference (loss and every
gradient, fp32), through the same launcher and checks as tests/test_executor_numerics.py.

torch's `ScheduleInterleavedZeroBubble` splits each backward into the input gradient and a
deferred weight gradient; the gradients must still equal the whole batch's. ZB-V and
DualPipeV need a V placement of the chunks the planner's layout does not produce yet, so
planner/capabilities.py refuses them (tested in tests/test_schedules.py) and they are not
run here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.test_executor_numerics import FP32_GRAD_RTOL, FP32_LOSS_RTOL, HF_NAMES, _run

PLANS = {
    "zb": dict(pp=2, schedule="interleaved_zb", nmb=2, mbs=1),
    "zb_v2": dict(pp=2, schedule="interleaved_zb", vpp=2, nmb=4, mbs=1),
}


@pytest.mark.multiprocess
def test_interleaved_zero_bubble_matches_reference(tmp_path: Path) -> None:
    """ZB1P with one and two chunks per rank on 2 ranks: loss and every gradient equal the
    reference, and the next step's loss too (the weight gradients were applied)."""
    results = _run(tmp_path, 2, PLANS)
    for name, kw in PLANS.items():
        checked: set[str] = set()
        for rank, res in results.items():
            r = res[name]
            assert r["layout"]["schedule"] == "ScheduleInterleavedZeroBubble", (name, rank)
            for got, want in zip(r["losses"], r["ref_losses"], strict=True):
                assert got == pytest.approx(want, rel=FP32_LOSS_RTOL), (name, rank, r["losses"])
            worst = max(r["grad_rel_err"].items(), key=lambda kv: kv[1])
            assert worst[1] <= FP32_GRAD_RTOL, (name, rank, worst)
            checked |= set(r["checked"])
        assert sorted(checked) == HF_NAMES[kw.get("family", "gpt2")], name
