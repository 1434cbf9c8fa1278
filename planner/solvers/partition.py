"""Pipeline partition: contiguous layer ranges per stage minimizing the slowest stage.

Dynamic program over (stages used, layers placed) (the classic linear-partition DP; PipeDream,
Narayanan et al. 2019 §3.1, and Megatron-LM's balanced split solve the same problem): a stage
holding layers [i, j) takes the sum of their times per micro-batch, and holds their parameters
and optimizer states plus their activations times the micro-batches in flight on that stage
(GPipe: m, Huang et al. 2019 §2.2; 1F1B: min(pp - stage, m), Narayanan et al. 2021 §2.2.1; see
`paraplan.planner.cost.memory.in_flight_microbatches`). Stage k must fit its memory limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..strategy import Schedule
from .schedule import SolveStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionSolution:
    """Result of `partition_layers`."""

    status: SolveStatus
    """OPTIMAL or INFEASIBLE."""
    stages: tuple[tuple[int, int], ...]
    """Layer range [start, stop) of each stage; empty if infeasible."""
    stage_times_s: tuple[float, ...]
    """Time per micro-batch of each stage."""
    stage_memory_bytes: tuple[float, ...]
    """Memory of each stage (static + activations x in-flight micro-batches)."""
    bottleneck_s: float | None
    """Time of the slowest stage; None if infeasible."""
    min_memory_bytes: float
    """Smallest memory limit, the same for every stage, with which some partition fits."""
    message: str
    """What happened, in words."""
    solve_s: float
    """Wall time of the solve."""


def in_flight_per_stage(
    schedule: Schedule, *, num_stages: int, num_microbatches: int, virtual_stages: int = 1
) -> tuple[float, ...]:
    """Micro-batches whose activations each stage holds at its peak, from the cost model."""
    from ..cost.memory import in_flight_microbatches

    return tuple(
        in_flight_microbatches(schedule, pp=num_stages, stage=k,
                               num_microbatches=num_microbatches, virtual_stages=virtual_stages)
        for k in range(num_stages)
    )  # fmt: skip


def _check(name: str, values: Sequence[float], n: int | None = None) -> list[float]:
    out = [float(v) for v in values]
    if n is not None and len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries, expected {n}; give one per item")
    for i, v in enumerate(out):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}[{i}]={v!r} must be a finite number >= 0; fix the input")
    return out


def partition_layers(
    layer_times_s: Sequence[float],
    static_bytes: Sequence[float],
    act_bytes: Sequence[float],
    *,
    num_stages: int,
    memory_limit_bytes: float | Sequence[float],
    in_flight: Sequence[float],
) -> PartitionSolution:
    """Split the layers into `num_stages` contiguous non-empty ranges minimizing the slowest
    stage's time, each stage k within `memory_limit_bytes` (one limit or one per stage), where
    stage k holds `static_bytes` + `in_flight[k]` x `act_bytes` of its layers. Ties go to the
    partition whose earlier stages end earliest."""
    start = time.perf_counter()
    times = _check("layer_times_s", layer_times_s)
    L = len(times)
    static, act = _check("static_bytes", static_bytes, L), _check("act_bytes", act_bytes, L)
    if not isinstance(num_stages, int) or not 1 <= num_stages <= L:
        raise ValueError(
            f"num_stages={num_stages!r} must be an integer from 1 to the {L} layers; "
            "use fewer stages or more layers"
        )
    flight = _check("in_flight", in_flight, num_stages)
    limits = (_check("memory_limit_bytes", memory_limit_bytes, num_stages)
              if isinstance(memory_limit_bytes, Sequence)
              else _check("memory_limit_bytes", [memory_limit_bytes])[:1] * num_stages)  # fmt: skip
    pt, ps, pa = [0.0], [0.0], [0.0]
    for i in range(L):
        pt.append(pt[-1] + times[i])
        ps.append(ps[-1] + static[i])
        pa.append(pa[-1] + act[i])

    def mem(k: int, i: int, j: int) -> float:
        return ps[j] - ps[i] + flight[k] * (pa[j] - pa[i])

    def solve(cost_of: str) -> tuple[float, list[list[int]]]:
        """Min over partitions of the max stage cost ("time", within limits, or "memory")."""
        inf = math.inf
        best = [[inf] * (L + 1) for _ in range(num_stages + 1)]
        cut = [[-1] * (L + 1) for _ in range(num_stages + 1)]
        best[0][0] = 0.0
        for k in range(1, num_stages + 1):
            for j in range(k, L - (num_stages - k) + 1):
                for i in range(k - 1, j):
                    if best[k - 1][i] == inf:
                        continue
                    m = mem(k - 1, i, j)
                    if cost_of == "time":
                        if m > limits[k - 1] * (1 + 1e-12):
                            continue
                        value = max(best[k - 1][i], pt[j] - pt[i])
                    else:
                        value = max(best[k - 1][i], m)
                    if value < best[k][j]:
                        best[k][j], cut[k][j] = value, i
        return best[num_stages][L], cut

    def ranges(cut: list[list[int]]) -> list[tuple[int, int]]:
        out, j = [], L
        for k in range(num_stages, 0, -1):
            i = cut[k][j]
            out.append((i, j))
            j = i
        return out[::-1]

    least, _ = solve("memory")
    bottleneck, cut = solve("time")
    if bottleneck == math.inf:
        return PartitionSolution(
            status=SolveStatus.INFEASIBLE, stages=(), stage_times_s=(), stage_memory_bytes=(),
            bottleneck_s=None, min_memory_bytes=least, solve_s=time.perf_counter() - start,
            message=(f"no split of {L} layers into {num_stages} stages fits the memory limits; "
                     f"the best split needs {least:.6g} bytes on its fullest stage: raise the "
                     "limit to that, add stages, or recompute/shard activations"),
        )  # fmt: skip
    parts = ranges(cut)
    return PartitionSolution(
        status=SolveStatus.OPTIMAL, stages=tuple(parts),
        stage_times_s=tuple(pt[j] - pt[i] for i, j in parts),
        stage_memory_bytes=tuple(mem(k, i, j) for k, (i, j) in enumerate(parts)),
        bottleneck_s=bottleneck, min_memory_bytes=least, solve_s=time.perf_counter() - start,
        message=f"optimal: slowest stage {bottleneck:.6g} s per micro-batch",
    )  # fmt: skip
