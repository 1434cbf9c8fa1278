"""Every strategy against a single-process reference of the same Hugging Face model and batch.

One torchrun launch per world size runs all the plans (a launch costs 4-11 s). In each plan
every rank first reports what was applied (schedule, wrapper, placements, checkpointed blocks,
offload), checked against the plan; then it compares the loss and the gradients of the
parameters it holds (gathered to full tensors, mapped back to the Hugging Face names and
layouts) with the reference, takes an SGD step on both sides and compares the next loss
(catching gradients that are right once but applied to the wrong copy, e.g. a tied matrix
split over pipeline stages).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.executor_helpers import launch, make_plan, tiny_model, write_plans

FP32_GRAD_RTOL = 1e-5
"""Largest |g - g_ref| / max|g_ref| per parameter (fp32 reductions in another order)."""
FP32_LOSS_RTOL = 1e-6
BF16_LOSS_RTOL = 2e-2
"""bf16 compute (8-bit mantissa) against the fp32 reference."""
BF16_GRAD_RTOL = 0.1

PLANS_2 = {
    "ddp": dict(dp=2, zero=0),
    "fsdp_zero1_as_zero2": dict(dp=2, zero=1),
    "fsdp_zero2": dict(dp=2, zero=2),
    "fsdp_zero3_accum": dict(dp=2, zero=3, nmb=2, mbs=1),
    "ddp_accum": dict(dp=2, zero=0, nmb=2, mbs=1),
    "tp": dict(tp=2),
    "tp_sp": dict(tp=2, sp=True),
    "llama_tp": dict(family="llama", tp=2),
    "llama_tp_sp": dict(family="llama", tp=2, sp=True),
    "pp_gpipe": dict(pp=2, schedule="gpipe", nmb=4, mbs=1),
    "pp_1f1b": dict(pp=2, schedule="1f1b", nmb=4, mbs=1),
    "pp_interleaved": dict(pp=2, schedule="interleaved_1f1b", vpp=2, nmb=4, mbs=1),
    "llama_pp_interleaved": dict(family="llama", pp=2, schedule="interleaved_1f1b", vpp=2, nmb=2),
    "recompute_fsdp": dict(dp=2, zero=3, recompute=("full", "selective", "none", "full")),
    "recompute_tp_sp": dict(tp=2, sp=True, recompute=("selective", "full", "full", "none")),
    "offload_zero3": dict(dp=2, zero=3, offload=True),
    "offload_zero2_recompute": dict(dp=2, zero=2, offload=True, recompute=("full",) * 4),
    "bf16_ddp": dict(dp=2, zero=0, precision="bf16"),
    "bf16_fsdp": dict(dp=2, zero=3, precision="bf16"),
}
PLANS_4 = {
    "dp2_tp2_ddp": dict(dp=2, tp=2, zero=0),
    "dp2_tp2_fsdp_sp": dict(dp=2, tp=2, zero=3, sp=True),
    "tp2_dp2_mesh_order": dict(dp=2, tp=2, zero=2, axis_order=("pp", "tp", "cp", "dp")),
    "dp2_pp2_ddp_1f1b": dict(dp=2, pp=2, zero=0, schedule="1f1b", nmb=2, mbs=1),
    "dp2_pp2_fsdp_interleaved": dict(
        dp=2, pp=2, zero=3, schedule="interleaved_1f1b", vpp=2, nmb=2, mbs=1
    ),
    "pp4_gpipe": dict(pp=4, schedule="gpipe", nmb=4, mbs=1),
    "pp2_tp2_sp_1f1b": dict(pp=2, tp=2, sp=True, schedule="1f1b", nmb=2, mbs=1),
}
HF_NAMES = {
    "gpt2": sorted(n for n, _ in tiny_model("gpt2").named_parameters()),
    "llama": sorted(n for n, _ in tiny_model("llama").named_parameters()),
}


def _run(tmp_path: Path, nproc: int, specs: dict[str, dict]) -> dict[int, dict]:
    paths = write_plans(tmp_path, {name: make_plan(**kw) for name, kw in specs.items()})
    proc = launch(nproc, "numerics", tmp_path, *paths, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)}


SCHEDULE_CLASSES = {
    "none": None,
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
}


def _expected_layout(kw: dict) -> dict[str, object]:
    """What parallelize must have applied for the plan `kw` (see executor/data_parallel.py)."""
    dp, tp, pp = kw.get("dp", 1), kw.get("tp", 1), kw.get("pp", 1)
    fsdp = kw.get("offload", False) or (dp > 1 and kw.get("zero", 0) >= 1)
    ddp = dp > 1 and not fsdp and tp == 1 and pp == 1
    replicate = dp > 1 and not fsdp and not ddp
    wrapper = (
        "DistributedDataParallel"
        if ddp
        else "FSDPChainModule"
        if fsdp
        else "ReplicateChainModule"
        if replicate
        else "ChainModule"
    )
    return {
        "schedule": SCHEDULE_CLASSES[kw.get("schedule", "none")],
        "wrapper": wrapper,
        "placements": (tp > 1) + (fsdp or replicate),  # DTensor mesh dims of a q_proj weight
        "recompute": sum(r != "none" for r in kw.get("recompute", ())),
        "offload": kw.get("offload", False),
    }


def _check(results: dict[int, dict], specs: dict[str, dict]) -> None:
    for name, kw in specs.items():
        want = _expected_layout(kw)
        for res in results.values():
            got = dict(res[name]["layout"], placements=len(res[name]["layout"]["placements"]))
            assert got == want, (name, got, want)
        bf16 = kw.get("precision") == "bf16"
        loss_rtol = BF16_LOSS_RTOL if bf16 else FP32_LOSS_RTOL
        grad_rtol = BF16_GRAD_RTOL if bf16 else FP32_GRAD_RTOL
        checked: set[str] = set()
        for rank, res in results.items():
            r = res[name]
            for got, want in zip(r["losses"], r["ref_losses"], strict=True):
                assert got == pytest.approx(want, rel=loss_rtol), (name, rank, r["losses"])
            worst = max(r["grad_rel_err"].items(), key=lambda kv: kv[1])
            assert worst[1] <= grad_rtol, (name, rank, worst)
            checked |= set(r["checked"])
        assert sorted(checked) == HF_NAMES[kw.get("family", "gpt2")], name  # every gradient


@pytest.mark.multiprocess
def test_two_ranks_match_reference(tmp_path: Path) -> None:
    """DDP, FSDP2 ZeRO-1/2/3, TP, TP+SP, PP (GPipe, 1F1B, interleaved 1F1B), checkpointing,
    offload, gradient accumulation and bf16, on GPT-2 and Llama."""
    _check(_run(tmp_path, 2, PLANS_2), PLANS_2)


@pytest.mark.multiprocess
def test_four_ranks_match_reference(tmp_path: Path) -> None:
    """DP x TP (DDP and FSDP+SP, both mesh orders), DP x PP, PP x TP+SP, 4 pipeline stages."""
    _check(_run(tmp_path, 4, PLANS_4), PLANS_4)
