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
