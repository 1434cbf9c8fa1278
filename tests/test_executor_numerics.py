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
from tests.executor_plans import HIDDEN, LAYERS, SEQ_LEN

FP32_GRAD_RTOL = 1e-5
"""Largest |g - g_ref| / max|g_ref| per parameter (fp32 reductions in another order)."""
FP32_LOSS_RTOL = 1e-6
BF16_LOSS_RTOL = 2e-2
"""bf16 compute (8-bit mantissa) against the fp32 reference."""
BF16_GRAD_RTOL = 0.1

PLANS_2 = {
    "ddp": dict(dp=2, zero=0),
    "zero1_accum": dict(dp=2, zero=1, nmb=2, mbs=1),
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
    "llama_cp2": dict(family="llama", cp=2),
    "cp2_recompute": dict(cp=2, recompute=("full", "full", "none", "full")),
    "mixtral_ep2": dict(family="mixtral", dp=2, ep=2),
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
    "llama_hsdp_2x2": dict(family="llama", dp=4, dp_shard=2, zero=3),
    "llama_dp2_cp2_fsdp": dict(family="llama", dp=2, cp=2, zero=3),
    "llama_cp2_tp2_sp": dict(family="llama", cp=2, tp=2, sp=True),
    "mixtral_dp4_ep2_fsdp": dict(family="mixtral", dp=4, ep=2, zero=2),
    "llama_dp2_cp2_zero1_selective": dict(
        family="llama", dp=2, cp=2, zero=1, recompute=("selective", "full", "none", "selective")
    ),
}
HF_NAMES = {
    family: sorted(n for n, _ in tiny_model(family).named_parameters())
    for family in ("gpt2", "llama", "mixtral")
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
    dp, tp, pp, cp = kw.get("dp", 1), kw.get("tp", 1), kw.get("pp", 1), kw.get("cp", 1)
    zero, ranks = kw.get("zero", 0), dp * cp  # data parallelism runs over dp x cp
    fsdp = kw.get("offload", False) or (ranks > 1 and zero >= 2)
    ddp = ranks > 1 and not fsdp and tp == 1 and pp == 1
    replicate = ranks > 1 and not fsdp and not ddp
    hsdp = kw.get("dp_shard", dp) < dp
    wrapper = (
        "DistributedDataParallel"
        if ddp
        else "FSDPChainModule"
        if fsdp
        else "ReplicateChainModule"
        if replicate
        else "ChainModule"
    )
    dp_dims = (fsdp or replicate) + hsdp  # DTensor mesh dims data parallelism adds
    vocab = tp > 1  # vocab-parallel embedding and head, under PP too
    return {
        "schedule": SCHEDULE_CLASSES[kw.get("schedule", "none")],
        "wrapper": wrapper,
        "placements": (tp > 1) + dp_dims,  # DTensor mesh dims of a q_proj weight
        # checkpointed blocks, over the pipeline ranks (each checks its own)
        "recompute": [i for i, r in enumerate(kw.get("recompute", ())) if r != "none"],
        "offload": kw.get("offload", False),
        "vocab_parallel": vocab,
        # the embedding table: split over the vocabulary (Shard(0) on tp) when TP runs
        "embed_placements": vocab + dp_dims if pp == 1 else None,
        # ZeRO-1: torch's ZeroRedundancyOptimizer beside DDP, ShardedStates beside replicate
        "optimizer": "SGD"
        if zero != 1 or fsdp or ranks == 1
        else "ZeroRedundancyOptimizer"
        if ddp
        else "ShardedStates",
    }


def _check(results: dict[int, dict], specs: dict[str, dict]) -> None:
    for name, kw in specs.items():
        want = _expected_layout(kw)
        blocks = sorted({b for res in results.values() for b in res[name]["layout"]["recompute"]})
        assert blocks == want.pop("recompute"), (name, blocks)
        for res in results.values():
            layout = dict(res[name]["layout"])
            layout.pop("recompute")
            embed = layout["embed_placements"]
            if want["vocab_parallel"] and embed:  # ranks holding the embedding
                assert embed[-1] == "S(0)", (name, embed)  # tp is the table's last mesh dim
            got = dict(
                layout,
                placements=len(layout["placements"]),
                embed_placements=len(embed) if want["embed_placements"] is not None else None,
            )
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
        # no pipeline stage keeps its micro-batches' logits past the step (memory the cost
        # model does not price: 2 x every micro-batch's logits on the last stage)
        assert all(res[name]["outputs_kept"] == 0 for res in results.values()), name
        if kw.get("sp") and kw.get("tp", 1) > 1:
            _check_sequence_parallel_collectives(name, kw, results)
        elif kw.get("tp", 1) > 1 and kw.get("family", "gpt2") != "mixtral":
            _check_tensor_parallel_collectives(name, kw, results)


def _check_tensor_parallel_collectives(name: str, kw: dict, results: dict[int, dict]) -> None:
    """Without SP each block all-reduces twice forward (the row-parallel outputs) and twice
    backward (the attention's and the MLP's input gradients, Megatron's f operator; Shoeybi
    et al. 2019 §3), plus the embedding's partial sums and the head's input gradient: more
    would mean q, k and v (or gate and up) each reducing their own input gradient. A fully
    recomputed block runs its forward's two again."""
    cp, pp, mbs, nmb = kw.get("cp", 1), kw.get("pp", 1), kw.get("mbs", 2), kw.get("nmb", 1)
    full = mbs * SEQ_LEN // cp * HIDDEN
    again = sum(r == "full" for r in kw.get("recompute", ()))  # over all stages: an upper bound
    for rank, res in results.items():
        calls = [tuple(c) for c in res[name]["collectives"]]
        whole = [c for c in calls if c == ("all_reduce", full)]
        assert len(whole) <= (4 * LAYERS // pp + 2 + 2 * again) * nmb, (name, rank, calls)


def _check_sequence_parallel_collectives(name: str, kw: dict, results: dict[int, dict]) -> None:
    """Under TP+SP each block's forward all-gathers its attention and MLP inputs and
    reduce-scatters their outputs, and its backward does the reverse: Megatron's count
    (Korthikanti et al. 2022 §4.2.2), which the cost model prices. A full-size all-reduce of a
    block activation would mean a column-parallel Linear reducing its own input gradient (3 per
    attention with separate q/k/v): only the embedding's partial sums and the head's gathered
    input may all-reduce one (one each per micro-batch, forward or backward)."""
    cp, pp, mbs = kw.get("cp", 1), kw.get("pp", 1), kw.get("mbs", 2)
    full = mbs * SEQ_LEN // cp * HIDDEN  # one micro-batch's (b, s/cp, h) activation
    for rank, res in results.items():
        calls = [tuple(c) for c in res[name]["collectives"]]
        whole = [c for c in calls if c == ("all_reduce", full)]
        scatters = [c for c in calls if c[0] == "reduce_scatter_tensor" and c[1] == full]
        assert len(whole) <= 2 * kw.get("nmb", 1), (name, rank, calls)
        blocks = LAYERS // pp  # a pipeline rank's blocks
        assert len(scatters) >= 4 * blocks * kw.get("nmb", 1), (name, rank, calls)


@pytest.mark.multiprocess
def test_two_ranks_match_reference(tmp_path: Path) -> None:
    """DDP, ZeRO-1 (DDP + ZeroRedundancyOptimizer), FSDP2 ZeRO-2/3, TP (vocab-parallel loss),
    TP+SP, PP (GPipe, 1F1B, interleaved 1F1B), checkpointing, offload, gradient accumulation,
    bf16, CP=2 (ring attention, load-balanced), EP=2 (all-to-all), on GPT-2, Llama and a
    tiny Mixtral."""
    _check(_run(tmp_path, 2, PLANS_2), PLANS_2)


@pytest.mark.multiprocess
def test_four_ranks_match_reference(tmp_path: Path) -> None:
    """DP x TP (DDP and FSDP+SP, both mesh orders), DP x PP, PP x TP+SP, 4 pipeline stages,
    HSDP 2x2, CP x DP (FSDP over dp x cp), CP x TP+SP, EP x DP (experts over 2 of 4 dp ranks),
    CP x DP with ZeRO-1 and selective recompute (the ring re-run in backward). ZeRO-1 with TP
    and PP, and the vocab-parallel head under PP: test_executor_readme_plans.py."""
    _check(_run(tmp_path, 4, PLANS_4), PLANS_4)
