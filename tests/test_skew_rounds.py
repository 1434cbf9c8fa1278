"""The sync skew's rounds taken at several points of a calibration (profiler/microbench_skew.py
`SkewSampler`): two gloo ranks sample together and read one figure, the larger of their
medians; with nothing sampled the figure is 0."""

from __future__ import annotations

import statistics
from typing import Any


def _skew_worker(rank: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from paraplan.profiler.microbench_skew import SEGMENTS_S, SkewSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        empty = SkewSampler().figure_s()
        sampler = SkewSampler()
        sampler.sample(1)  # two points of a calibration, a round each
        sampler.sample(2)
        own = max(0.0, statistics.median(sampler.extra_s))
        out.put((rank, empty, sampler.figure_s(), own, len(sampler.extra_s), len(SEGMENTS_S)))
    finally:
        dist.destroy_process_group()


def test_rounds_at_several_points_are_one_figure_on_both_ranks() -> None:
    """Every round times each segment length once; the figure is the same on both ranks, the
    larger rank's median of every round sampled, 0 or more and well under a tiny step
    (0.1-1.3 ms on this VM, 2026-11-26/29)."""
    import torch.multiprocessing as mp

    from tests.executor_helpers import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(
        _skew_worker, args=(free_port(), out), nprocs=2, join=True, start_method="spawn"
    )
    got = sorted(out.get(timeout=120) for _ in range(2))
    assert [g[1] for g in got] == [0.0, 0.0]
    assert got[0][2] == got[1][2] == max(g[3] for g in got)
    assert 0.0 <= got[0][2] < 5e-3
    assert [g[4] for g in got] == [3 * g[5] for g in got]
