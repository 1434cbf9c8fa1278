"""Several rounds of a calibration's kernel measurements, combined figure by figure.

One round of the kernel benchmarks carries outliers in single figures on a shared machine
(on this VM, 2026-11-25: fp32 causal attention with 16-wide heads measured 6.2 GFLOP/s
backward at one size in one calibration, 18-19 in three others and in the executor's own
step; DTensor's AdamW cost per tensor 136-399 us), and a plan priced on such a figure misses
by tens of percent. The rounds run one after the other, each measuring every figure again,
and every figure keeps its median round: an outlier in one round, either way, is dropped.

Not the fastest round: the machine a plan runs on is the same shared machine, and priced on
each figure's fastest of three rounds, 2-rank GPT-2 runs measured 20-60% slower than
predicted, every one of them (tiny and gpt-small, fp32 and bf16, 2026-11-25; the median of a
single round had them within +-20%).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from ..planner.cost.calibrated import AttentionCurve, GemmGrid, KernelFit, OpRate


def median_fit(fits: Sequence[KernelFit]) -> KernelFit:
    """One fit from rounds of the same measurements: per figure (each point of a curve or
    grid on its own), the median of the rounds. The rounds must have measured the same grid
    (same shapes, sizes and operators)."""
    if not fits:
        raise ValueError("no calibration round to combine")
    first = fits[0]
    if len(fits) == 1:
        return first
    med = statistics.median
    return dataclasses.replace(
        first,
        launch_s=med(f.launch_s for f in fits),
        raw_dispatch_s=med(f.raw_dispatch_s for f in fits),
        elementwise_bw_bytes_per_s=med(f.elementwise_bw_bytes_per_s for f in fits),
        gemm=_median_grid([f.gemm for f in fits]),
        attention=_median_attention([f.attention for f in fits]),
        stream_bw_bytes_per_s=_pointwise_median(
            [f.stream_bw_bytes_per_s for f in fits], "stream bandwidth curve"
        ),
        special_rates=_median_ops([f.special_rates for f in fits]),
        checkpoint_region_s=med(f.checkpoint_region_s for f in fits),
        checkpoint_saved_tensor_s=med(f.checkpoint_saved_tensor_s for f in fits),
        page_fault_s_per_byte=med(f.page_fault_s_per_byte for f in fits),
    )


def _pointwise_median(rows: Sequence[tuple[float, ...]], what: str) -> tuple[float, ...]:
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"calibration rounds measured different {what}s; re-run calibrate")
    return tuple(statistics.median(column) for column in zip(*rows, strict=True))


def _median_grid(grids: Sequence[GemmGrid]) -> GemmGrid:
    g = grids[0]
    if any((x.m, x.n, x.k) != (g.m, g.n, g.k) for x in grids):
        raise ValueError("calibration rounds measured different GEMM grids; re-run calibrate")
    return dataclasses.replace(
        g,
        fwd_flops_per_s=_pointwise_median([x.fwd_flops_per_s for x in grids], "GEMM grid"),
        bwd_flops_per_s=_pointwise_median([x.bwd_flops_per_s for x in grids], "GEMM grid"),
    )


def _median_attention(curves: Sequence[AttentionCurve | None]) -> AttentionCurve | None:
    measured = [c for c in curves if c is not None]
    if not measured:
        return None
    c = measured[0]
    if any((x.head_dims, x.dense_fwd_flops) != (c.head_dims, c.dense_fwd_flops) for x in measured):
        raise ValueError("calibration rounds measured different attention curves")
    return dataclasses.replace(
        c,
        fwd_flops_per_s=_pointwise_median([x.fwd_flops_per_s for x in measured], "attention"),
        bwd_flops_per_s=_pointwise_median([x.bwd_flops_per_s for x in measured], "attention"),
    )


def _median_ops(rounds: Sequence[tuple[OpRate, ...]]) -> tuple[OpRate, ...]:
    rates: dict[str, list[float]] = {}
    for measured in rounds:
        for r in measured:
            rates.setdefault(r.op, []).append(r.elems_per_s)
    return tuple(OpRate(op=op, elems_per_s=statistics.median(v)) for op, v in rates.items())
