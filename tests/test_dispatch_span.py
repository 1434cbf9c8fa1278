"""The per-operator dispatch figure over a calibration's span (`profiler/microbench_dispatch.py`):
the pooled median against numpy's, a slow spell a round would have caught left out of it, too
few samples leaving the rounds' figure, and the sampler timing the same chains as the rounds
on a CPU only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paraplan.profiler import microbench as mb
from paraplan.profiler.microbench_dispatch import (
    MIN_SAMPLES,
    DispatchFigure,
    DispatchSampler,
    pooled_figures,
)
from paraplan.profiler.microbench_timer import Timer


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_figure_is_the_median_over_every_rank_field_by_field(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks = [
        {
            "fp32": [
                DispatchFigure(raw_s=float(a), trained_s=float(b))
                for a, b in rng.lognormal(-12.0, 0.3, size=(n, 2))
            ]
        }
        for n in (17, 24)
    ]
    got = pooled_figures(ranks)["fp32"]
    every = [f for rank in ranks for f in rank["fp32"]]
    assert got.raw_s == pytest.approx(float(np.median([f.raw_s for f in every])), rel=1e-12)
    assert got.trained_s == pytest.approx(float(np.median([f.trained_s for f in every])), rel=1e-12)


def test_a_two_state_machine_reads_its_usual_state_not_the_one_a_round_caught() -> None:
    """The VM's operator cost switches between ~4 and ~7 us (module docstring): samples over
    the span, 70% of them slow, read the slow state, where three rounds that happened to
    land in a fast spell read 4 us."""
    fast, slow = DispatchFigure(2e-6, 4e-6), DispatchFigure(3.5e-6, 7e-6)
    span = [slow] * 70 + [fast] * 30
    got = pooled_figures([{"bf16": span[::2]}, {"bf16": span[1::2]}])["bf16"]
    assert got == slow


def test_too_few_samples_keep_the_rounds_figure() -> None:
    few = [DispatchFigure(1e-6, 2e-6)] * (MIN_SAMPLES - 1)
    enough = [DispatchFigure(1e-6, 2e-6)] * MIN_SAMPLES
    assert pooled_figures([{"fp32": few}]) == {}
    # counted over the ranks together
    assert set(pooled_figures([{"fp32": few}, {"fp32": few}, {"bf16": enough}])) == {
        "fp32",
        "bf16",
    }


def test_the_sampler_times_the_rounds_chains_on_a_cpu_only() -> None:
    sampler = DispatchSampler(torch.device("cpu"), ["fp32", "bf16"])
    for _ in range(3):
        sampler.sample()
    assert {k: len(v) for k, v in sampler.samples.items()} == {"fp32": 3, "bf16": 3}
    # the same chains as a round's figure, so of the same size: within 10x of it here
    raw, trained = mb.dispatch_s(Timer(torch.device("cpu"), 5, group=False), torch.float32)
    for s in sampler.samples["fp32"]:
        assert raw / 10 < s.raw_s < raw * 10 and trained / 10 < s.trained_s < trained * 10
    gpu = DispatchSampler(torch.device("cuda"), ["bf16"])  # built without touching CUDA
    gpu.sample()
    assert not gpu.active and gpu.samples == {}


def test_a_part_measured_on_a_slow_spell_is_brought_to_the_spans_speed() -> None:
    """A part whose own samples read the slow state (7 us per operator, where the span pooled
    4 us) has its host figures scaled by 4/7: record G's TP+SP block, 8.4/8.7 ms measured on
    such a spell, comes out 4.8/5.0 ms. Samples taken before the part do not count toward its
    window; a window of fewer than three samples, or a dtype not pooled, leaves it as it is."""
    from paraplan.planner.calibration_tp import TensorParallelBlock, TensorParallelDispatch
    from paraplan.profiler.microbench_dispatch import MIN_WINDOW_SAMPLES, tp_at_speed
    from paraplan.profiler.microbench_tp import FsdpUnitCost

    sampler = DispatchSampler(torch.device("cpu"), ("fp32",))
    fast, slow = DispatchFigure(2e-6, 4e-6), DispatchFigure(3.5e-6, 7e-6)
    sampler.samples["fp32"] += [fast] * 5  # before the part: outside its window
    readings = iter([slow, slow, fast, slow])

    def part(between: object) -> str:
        for _ in range(4):  # what `between` does: one more sample per round
            sampler.samples["fp32"].append(next(readings))
        return "measured"

    value, window = sampler.during(part)
    assert value == "measured" and (window.start, window.stop) == (5, 9)
    pooled = {"fp32": fast}
    ratio = sampler.speed_ratio(window, pooled)
    assert ratio == pytest.approx(4.0 / 7.0)
    block = TensorParallelBlock(gated=False, sequence_parallel=True, fwd_s=8.4e-3, bwd_s=8.7e-3)
    tp = TensorParallelDispatch(blocks=(block,), loss_fwd_s=2.1e-3, loss_bwd_s=0.7e-3)
    got = tp_at_speed(tp, ratio)
    assert got is not None
    assert got.blocks[0].fwd_s == pytest.approx(4.8e-3)
    assert got.blocks[0].bwd_s == pytest.approx(8.7e-3 * 4 / 7)
    assert got.loss_fwd_s == pytest.approx(1.2e-3)
    assert got.blocks[0].sequence_parallel and not got.blocks[0].gated
    fsdp = FsdpUnitCost(unit_s=2.8e-3, tensor_s=70e-6).at_speed(ratio)
    assert (fsdp.unit_s, fsdp.tensor_s) == pytest.approx((1.6e-3, 40e-6))
    assert tp_at_speed(None, ratio) is None
    short = type(window)(start=5, stop=5 + MIN_WINDOW_SAMPLES - 1)
    assert sampler.speed_ratio(short, pooled) == 1.0
    assert sampler.speed_ratio(window, {"bf16": fast}) == 1.0
    gpu = DispatchSampler(torch.device("meta"), ("fp32",))  # not a CPU: nothing sampled
    _, none = gpu.during(lambda between: between())
    assert gpu.speed_ratio(none, pooled) == 1.0
