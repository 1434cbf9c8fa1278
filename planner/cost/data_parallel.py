"""Data-parallel traffic (DDP / ZeRO 1-3) and the optimizer step of one pipeline stage."""

from __future__ import annotations

from ..config import TrainConfig
from ..hardware import Accelerator
from ..strategy import Strategy
from .comm import Collectives, Links
from .layout import Stage

HOST_OPTIMIZER_BYTES_PER_S = 20e9
"""Effective host memory bandwidth one GPU's share of a CPU optimizer step streams at. An
assumption in line with ZeRO-Offload's CPU-Adam (Ren et al. 2021 §4.2, ~1.5 s per step for
10B parameters on a DGX-2 host); calibrate for your hosts."""


def dp_comm(
    s: Strategy,
    stage: Stage,
    links: Links,
    coll: Collectives,
    t: TrainConfig,
    fwd: float,
    bwd: float,
) -> tuple[float, float]:
    """(exposed seconds per micro-batch, exposed seconds once per step) of ZeRO/DDP
    traffic for one stage. Overlap: gradient reduction with the backward pass, parameter
    gathers with the forward pass (DDP buckets, Li et al. 2020; FSDP prefetch, Zhao 2023)."""
    per_mb = tail = 0.0
    groups = (
        (stage.dense_params / s.tp, links.dpcp),
        (stage.expert_params / (s.tp * s.ep), links.edp),
    )
    for count, link in groups:
        if not count or link.size <= 1:
            continue
        ag = coll.all_gather(count * t.param_bytes, link)
        rs = coll.reduce_scatter(count * t.grad_bytes, link)
        if s.zero_stage == 3:  # gather for forward, again for backward, reduce-scatter
            per_mb += max(0.0, ag - fwd) + max(0.0, ag + rs - bwd)
        elif s.zero_stage == 2:  # reduce-scatter every micro-batch, gather after the step
            per_mb += max(0.0, rs - bwd)
            tail += max(0.0, ag - fwd)
        elif s.zero_stage == 1:  # reduce-scatter once per step, gather after the step
            tail += max(0.0, rs - bwd) + max(0.0, ag - fwd)
        else:  # all-reduce once per step, overlapped with the last backward
            tail += max(0.0, coll.all_reduce(count * t.grad_bytes, link) - bwd)
    return per_mb, tail


def optimizer_s(s: Strategy, stage: Stage, t: TrainConfig, acc: Accelerator) -> float:
    """Optimizer step: memory-bound over the rank's shard of states (read and write), or on
    the host with the gradient/parameter PCIe transfers (Ren et al. 2021 §4)."""
    dpcp = s.dp * s.cp if s.zero_stage >= 1 else 1
    edp = dpcp // s.ep if s.zero_stage >= 1 else 1  # experts shard over dp*cp/ep
    shard = stage.dense_params / s.tp / dpcp + stage.expert_params / (s.tp * s.ep) / edp
    state_bytes = shard * (t.param_bytes + t.grad_bytes + t.optimizer_bytes)
    if not s.offload_optimizer:
        return 2 * state_bytes / acc.memory_bw_bytes_per_s
    pcie = shard * (t.grad_bytes + t.param_bytes) / acc.pcie_bw_bytes_per_s
    return pcie + 2 * state_bytes / HOST_OPTIMIZER_BYTES_PER_S
