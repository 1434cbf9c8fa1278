"""Calibration rounds combined figure by figure: each keeps its median round."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.planner.cost.calibrated import AttentionCurve, GemmGrid, KernelFit, OpRate
from paraplan.profiler.microbench import FULL, QUICK
from paraplan.profiler.microbench_rounds import median_fit


def _fit(gemm: tuple[float, float], attn: tuple[float, float], **figures: object) -> KernelFit:
    """A one-point-per-axis fit: GEMM (fwd, bwd) and attention (fwd, bwd) rates."""
    values: dict[str, object] = {
        "launch_s": 4e-6,
        "elementwise_bw_bytes_per_s": 2e10,
        "gemm": GemmGrid(
            m=(64,), n=(64,), k=(64,), fwd_flops_per_s=(gemm[0],), bwd_flops_per_s=(gemm[1],)
        ),
        "attention": AttentionCurve(
            head_dims=(16,),
            dense_fwd_flops=(1e6,),
            fwd_flops_per_s=(attn[0],),
            bwd_flops_per_s=(attn[1],),
        ),
        "stream_tensor_bytes": (1e3, 1e6),
        "stream_bw_bytes_per_s": (5e10, 2e10),
        "special_rates": (OpRate(op="aten.tanh", elems_per_s=1e8),),
        "raw_dispatch_s": 2e-6,
        "checkpoint_region_s": 1e-4,
        "checkpoint_saved_tensor_s": 2e-5,
        "page_fault_s_per_byte": 5e-10,
    }
    values.update(figures)
    return KernelFit(**values)  # type: ignore[arg-type]


def test_every_figure_keeps_its_median_round_whichever_round_that_is() -> None:
    # three rounds; the median comes from a different round for different figures, and an
    # outlier either way (the 6.2 GFLOP/s attention backward, a 3x slow AdamW) is dropped
    a = _fit((5e10, 3e10), (2e10, 6.2e9), launch_s=5e-6, page_fault_s_per_byte=4e-10)
    b = _fit(
        (4e10, 3.5e10),
        (1.8e10, 1.9e10),
        launch_s=4.2e-6,
        elementwise_bw_bytes_per_s=2.2e10,
        stream_bw_bytes_per_s=(4e10, 2.5e10),
        special_rates=(
            OpRate(op="aten.tanh", elems_per_s=0.9e8),
            OpRate(op="aten.exp", elems_per_s=3e8),
        ),
        raw_dispatch_s=2.5e-6,
        checkpoint_region_s=0.8e-4,
        checkpoint_saved_tensor_s=1e-5,
        page_fault_s_per_byte=6e-10,
    )
    c = _fit(
        (4.5e10, 3.2e10),
        (1.9e10, 1.8e10),
        launch_s=4.5e-6,
        elementwise_bw_bytes_per_s=1.8e10,
        stream_bw_bytes_per_s=(4.5e10, 3e10),
        special_rates=(OpRate(op="aten.tanh", elems_per_s=1.2e8),),
        raw_dispatch_s=3e-6,
        page_fault_s_per_byte=5.5e-10,
    )
    mid = median_fit([a, b, c])
    assert mid.launch_s == 4.5e-6
    assert mid.raw_dispatch_s == 2.5e-6
    assert mid.elementwise_bw_bytes_per_s == 2e10
    assert mid.gemm.fwd_flops_per_s == (4.5e10,) and mid.gemm.bwd_flops_per_s == (3.2e10,)
    assert mid.attention is not None
    assert mid.attention.fwd_flops_per_s == (1.9e10,)
    assert mid.attention.bwd_flops_per_s == (1.8e10,)  # not the 6.2 GFLOP/s outlier
    assert mid.stream_bw_bytes_per_s == (4.5e10, 2.5e10)
    # tanh in all three rounds; exp measured in one only keeps that one
    assert {r.op: r.elems_per_s for r in mid.special_rates} == {"aten.tanh": 1e8, "aten.exp": 3e8}
    assert mid.checkpoint_region_s == 1e-4
    assert mid.checkpoint_saved_tensor_s == 2e-5  # b's 1e-5 is the low outlier
    assert mid.page_fault_s_per_byte == 5.5e-10
    assert median_fit([a]) is a


def test_rounds_of_different_grids_are_refused() -> None:
    a = _fit((5e10, 3e10), (2e10, 2e10))
    other = GemmGrid(m=(128,), n=(64,), k=(64,), fwd_flops_per_s=(1e10,), bwd_flops_per_s=(1e10,))
    with pytest.raises(ValueError, match="different GEMM grids"):
        median_fit([a, dataclasses.replace(a, gemm=other)])
    with pytest.raises(ValueError, match="no calibration round"):
        median_fit([])


def test_the_full_calibration_runs_rounds_and_quick_one() -> None:
    assert FULL.rounds >= 2 and QUICK.rounds == 1
