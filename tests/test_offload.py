"""Parameter and activation offload (ZeRO-Offload / ZeRO-Infinity CPU tier, vDNN): what
leaves the GPU, the PCIe traffic against FSDP2's copies counted by hand, time only ever
added, the search's use of it when nothing fits otherwise, the plan and `explain`, version-4
plans, and (gloo, 2 ranks) loss and every gradient equal to the single-process reference."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.api import plan
from paraplan.planner.capabilities import plan_gaps
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.data_parallel import OVERLAP_CONTENTION
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.memory import layer_act_bytes
from paraplan.planner.explain import explain
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan_io import load_plan, plan_from_dict, save_plan
from paraplan.planner.strategy import Recompute, Schedule, Strategy

FP32_LOSS_RTOL, FP32_GRAD_RTOL = 1e-6, 1e-5
"""Tolerances of the executor's fp32 numerics tests (tests/test_executor_numerics.py)."""


def _ev(
    model: str = "llama3-8b", cluster: str = "8xa100-40gb", batch: int = 16, seq: int = 2048
) -> Evaluator:
    profile = parse_model(model).to_profile(seq, act_bytes=2)
    return Evaluator(profile, parse_cluster(cluster), TrainConfig(global_batch=batch, seq_len=seq))


ZERO3 = Strategy(dp=8, tp=1, pp=1, zero_stage=3, offload_optimizer=True)


def test_parameter_offload_moves_states_and_copies_fsdp_shards() -> None:
    ev = _ev()
    s = replace(ZERO3, offload_params=True)
    plain, off = ev.memory(ZERO3)[0], ev.memory(s)[0]
    assert (off.params_bytes, off.grads_bytes, off.optimizer_bytes) == (0.0, 0.0, 0.0)
    assert off.other_bytes == plain.other_bytes  # the gathered units stay on the GPU
    assert off.activations_bytes == plain.activations_bytes
    # FSDP2 with CPUOffloadPolicy: each unit's parameter shard goes to the GPU before each of
    # its two all-gathers (forward, backward) and its gradient shard back after the
    # reduce-scatter: per micro-batch 2 x params + 1 x grads of the rank's 1/8 shard.
    sm = ev.stage_model
    lay = sm.layout_of(s)
    (stage,), (c,) = sm.stages(lay), sm.stage_compute(lay, 1, 1, 1, 1)
    cost = ev.options.offload.cost(s, stage, c, Recompute.NONE)
    t = ev.train
    want = ev.profile.num_params / 8 * (2 * t.param_bytes + t.grad_bytes)
    assert cost.param_bytes == pytest.approx(want, rel=1e-9)
    assert cost.activation_bytes == 0.0


def test_activation_offload_keeps_two_blocks_on_the_gpu() -> None:
    ev = _ev()
    s = Strategy(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=2)
    off = replace(s, offload_activations=True)
    mem = ev.memory(off)[0]
    # Korthikanti et al. 2022 Table 2 bytes per layer, summed independently of the planner's
    # prefix sums: embedding + head kept, two blocks' worth of the blocks', plus the transient
    per_seq = {
        x.kind: layer_act_bytes(x, tp=1, sp=False, cp=1, recompute=Recompute.NONE)
        for x in ev.profile.layers
    }
    lay = ev.stage_model.layout_of(s)
    (acts,) = ev.stage_model.stage_activations(lay, 1, False, 1, Recompute.NONE)
    kept = per_seq[LayerKind.EMBEDDING] + per_seq[LayerKind.HEAD] + 2 * per_seq[LayerKind.BLOCK]
    want = (kept * ev.stage_model.act_scale + acts.transient_bytes) * 2
    assert mem.activations_bytes == pytest.approx(want, rel=1e-9)
    assert mem.activations_bytes < ev.memory(replace(s, recompute=Recompute.FULL))[0].total_bytes


@pytest.mark.parametrize(
    "s",
    [
        replace(ZERO3, offload_params=True),
        replace(ZERO3, offload_activations=True),
        replace(ZERO3, offload_params=True, offload_activations=True, micro_batch_size=2),
        Strategy(dp=4, tp=1, pp=2, schedule=Schedule.ONE_F_ONE_B, offload_activations=True),
    ],
    ids=["params", "activations", "both", "pp2-acts"],
)
def test_offload_only_adds_time_within_the_copy_bounds(s: Strategy) -> None:
    ev = _ev()
    plain = replace(s, offload_params=False, offload_activations=False)
    added = ev.time(s).step_time_s - ev.time(plain).step_time_s
    m = ev.num_microbatches(s)
    sm = ev.stage_model
    lay = sm.layout_of(s)
    stages, compute = sm.stages(lay), sm.stage_compute(lay, s.tp, s.cp, s.ep, s.micro_batch_size)
    pairs = zip(stages, compute, strict=True)
    costs = [ev.options.offload.cost(s, st, c, ev.policy(s)) for st, c in pairs]
    copy_s = max(c.pcie_bytes for c in costs) / ev.acc.pcie_bw_bytes_per_s
    units = ev.profile.num_blocks // s.pp + 1
    assert added > 0  # never free
    assert added >= m * copy_s / units * 0.99  # at least the first copy of each pass waits
    assert added <= m * copy_s * (1 + OVERLAP_CONTENTION) * 1.01  # at most all, slowed


def test_search_offloads_only_when_nothing_fits_without() -> None:
    fits = plan("gpt2", "8xh100", global_batch=64, seq_len=1024, model_source="spec").plan
    assert not (fits.parallelism.offload_params or fits.parallelism.offload_activations)
    kw = dict(global_batch=4, seq_len=4096, model_source="spec")
    without = plan("llama3-8b", "4xl4", fix="offload_params=false,offload_acts=false", **kw).plan
    chosen = plan("llama3-8b", "4xl4", **kw).plan
    par = chosen.parallelism
    assert par.offload_params or par.offload_activations
    assert chosen.feasible and chosen.predicted.step_time_s < without.predicted.step_time_s
    assert plan_gaps(chosen) == ()  # FSDP2 CPUOffloadPolicy and saved-tensor offload run
    blocks = [d for d in chosen.layers if d.name.startswith("block")]
    assert all(d.offload_activations == par.offload_activations for d in blocks)
    assert not chosen.layers[0].offload_activations  # the embedding keeps its own
    hidden = chosen.predicted.hidden_costs
    assert hidden.offload_pcie_bytes > 0 and hidden.offload_saved_bytes > 0
    assert "Offload:" in explain(chosen) and "over PCIe" in explain(chosen)


def test_offload_pins_name_the_rule() -> None:
    with pytest.raises(ValueError, match="offload_params with zero_stage=2"):
        plan("gpt2", "8xh100", global_batch=64, seq_len=1024, fix="offload_params=true,zero=2")


def test_plans_round_trip_and_version_4_still_loads(tmp_path: Path) -> None:
    kw = dict(global_batch=4, seq_len=4096, model_source="spec")
    p = plan("llama3-8b", "4xl4", fix="offload_params=false,offload_acts=false", **kw).plan
    save_plan(p, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == p
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["schema_version"] = 4  # as paraplan wrote it before version 5
    for par in [doc["parallelism"], *(r["parallelism"] for r in doc["runners_up"])]:
        for key in ("powersgd_rank", "offload_params", "offload_activations", "async_pipeline"):
            del par[key]
    del doc["predicted"]["hidden_costs"]
    for layer in doc["layers"]:
        del layer["offload_activations"]
    del doc["predicted"]["model_flops_per_s_per_gpu"]  # version 6's: not recorded before
    unrecorded = replace(p, predicted=replace(p.predicted, model_flops_per_s_per_gpu=None))
    assert plan_from_dict(doc) == unrecorded
    doc["schema_version"] = 3
    with pytest.raises(ValueError, match="schema_version 3 is not supported"):
        plan_from_dict(doc)


# ---- gloo: parameter and activation offload equal the reference ------------------------------


@pytest.mark.multiprocess
def test_offload_matches_reference_on_two_ranks(tmp_path: Path) -> None:
    from tests.executor_helpers import launch, make_plan, write_plans

    base = make_plan(dp=2, zero=3, offload=True, nmb=2, mbs=1, recompute=("full", "none") * 2)
    offloaded = replace(
        base,
        parallelism=replace(base.parallelism, offload_params=True),
        layers=tuple(
            replace(d, offload_activations=d.name.startswith("block")) for d in base.layers
        ),
    )
    paths = write_plans(tmp_path, {"offload": offloaded})
    proc = launch(2, "numerics", tmp_path, *paths, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())["offload"]
        assert r["layout"]["offload"] is True  # FSDP2 CPUOffloadPolicy applied
        for got, want in zip(r["losses"], r["ref_losses"], strict=True):
            assert got == pytest.approx(want, rel=FP32_LOSS_RTOL)
        worst = max(r["grad_rel_err"].items(), key=lambda kv: kv[1])
        assert worst[1] <= FP32_GRAD_RTOL, worst
        assert len(r["checked"]) == len(r["grad_rel_err"]) > 0  # every gradient compared


def test_executor_offloads_saved_activations_outside_checkpoints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from paraplan.executor.compose import causal_lm_loss
    from paraplan.executor.convert import to_chain_module
    from paraplan.executor.offload import apply_activation_offload
    from paraplan.executor.recompute import apply_recompute
    from tests.executor_plans import tiny_model

    entered: list[int] = []
    real = torch.autograd.graph.save_on_cpu

    def counting(pin_memory: bool = False) -> object:
        entered.append(1)
        return real(pin_memory=pin_memory)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", counting)
    ref = to_chain_module(tiny_model("gpt2"))
    chain = to_chain_module(tiny_model("gpt2"))  # same seed: same weights
    apply_recompute(chain, {1: Recompute.FULL, 3: Recompute.SELECTIVE})
    assert apply_activation_offload(chain, frozenset({1, 2, 3, 4})) == 4
    x = torch.randint(0, 512, (2, 16))  # (B, T)
    causal_lm_loss(chain(x), x).backward()
    assert len(entered) == 4  # once per block forward, never in a checkpoint's recompute
    causal_lm_loss(ref(x), x).backward()
    grads = dict(ref.named_parameters())
    for name, p in chain.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad)


def test_pinned_offload_search_equals_brute_force() -> None:
    from paraplan.planner.pins import Pins
    from paraplan.planner.search import Search, rank_key
    from paraplan.planner.search_brute import brute_force

    ev = _ev("gpt2", "16xl4", batch=32, seq=1024)
    pins = Pins(tp=1, cp=1, offload_activations=True)
    best = Search(ev, pins).run(top_k=0).best
    brute = brute_force(ev, pins)
    assert best is not None and brute
    assert best.strategy.offload_activations and brute[0].strategy.offload_activations
    assert rank_key(best) == rank_key(brute[0])
