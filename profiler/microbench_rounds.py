"""Several rounds of a calibration's kernel measurements, combined figure by figure.

A shared machine only ever slows a measurement down: a neighbour's burst, a page-cache
flush or the other rank's garbage collector adds time, never removes it. One round of the
kernel benchmarks therefore carries outliers in single figures (on this VM, 2026-11-25: fp32
causal attention with 16-wide heads measured 6.2 GFLOP/s backward at one size in one
calibration, 18-19 in three others and in the executor's own step; elementwise bandwidth
16-22 GB/s; DTensor's AdamW cost per tensor 136-399 us), and a plan priced on such a figure
misses by tens of percent. The rounds run one after the other, each measuring every figure
again, and every figure keeps its fastest round: the machine undisturbed, which is what a
plan prices (the closed loop's `--from-run` refit absorbs a steady slowdown).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..planner.cost.calibrated import AttentionCurve, GemmGrid, KernelFit, OpRate


def fastest_fit(fits: Sequence[KernelFit]) -> KernelFit:
    """One fit from rounds of the same measurements: per figure, the fastest round (rates at
    their highest, seconds per operator or per byte at their lowest). The rounds must have
    measured the same grid (same shapes, sizes and operators)."""
    if not fits:
        raise ValueError("no calibration round to combine")
    first = fits[0]
    if len(fits) == 1:
        return first
    return dataclasses.replace(
        first,
        launch_s=min(f.launch_s for f in fits),
        raw_dispatch_s=min(f.raw_dispatch_s for f in fits),
        elementwise_bw_bytes_per_s=max(f.elementwise_bw_bytes_per_s for f in fits),
        gemm=_fastest_grid([f.gemm for f in fits]),
        attention=_fastest_attention([f.attention for f in fits]),
        stream_bw_bytes_per_s=_pointwise_max(
            [f.stream_bw_bytes_per_s for f in fits], "stream bandwidth curve"
        ),
        special_rates=_fastest_ops([f.special_rates for f in fits]),
        checkpoint_region_s=min(f.checkpoint_region_s for f in fits),
        page_fault_s_per_byte=min(f.page_fault_s_per_byte for f in fits),
    )


def _pointwise_max(rows: Sequence[tuple[float, ...]], what: str) -> tuple[float, ...]:
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"calibration rounds measured different {what}s; re-run calibrate")
    return tuple(max(column) for column in zip(*rows, strict=True))


def _fastest_grid(grids: Sequence[GemmGrid]) -> GemmGrid:
    g = grids[0]
    if any((x.m, x.n, x.k) != (g.m, g.n, g.k) for x in grids):
        raise ValueError("calibration rounds measured different GEMM grids; re-run calibrate")
    return dataclasses.replace(
        g,
        fwd_flops_per_s=_pointwise_max([x.fwd_flops_per_s for x in grids], "GEMM grid"),
        bwd_flops_per_s=_pointwise_max([x.bwd_flops_per_s for x in grids], "GEMM grid"),
    )


def _fastest_attention(curves: Sequence[AttentionCurve | None]) -> AttentionCurve | None:
    measured = [c for c in curves if c is not None]
    if not measured:
        return None
    c = measured[0]
    if any((x.head_dims, x.dense_fwd_flops) != (c.head_dims, c.dense_fwd_flops) for x in measured):
        raise ValueError("calibration rounds measured different attention curves")
    return dataclasses.replace(
        c,
        fwd_flops_per_s=_pointwise_max([x.fwd_flops_per_s for x in measured], "attention"),
        bwd_flops_per_s=_pointwise_max([x.bwd_flops_per_s for x in measured], "attention"),
    )


def _fastest_ops(rounds: Sequence[tuple[OpRate, ...]]) -> tuple[OpRate, ...]:
    best: dict[str, float] = {}
    order: list[str] = []
    for rates in rounds:
        for r in rates:
            if r.op not in best:
                order.append(r.op)
            best[r.op] = max(best.get(r.op, 0.0), r.elems_per_s)
    return tuple(OpRate(op=op, elems_per_s=best[op]) for op in order)
