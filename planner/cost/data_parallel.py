"""Data-parallel traffic (DDP / ZeRO 1-3) and the optimizer step of one pipeline stage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import FP32_BYTES, Precision, TrainConfig
from ..hardware import Accelerator
from ..model import LayerCost
from ..strategy import Strategy
from .comm import AxisLink, Collectives, Links
from .compression import PowerSGDModel
from .compute import Kernels
from .layout import Stage

HOST_OPTIMIZER_BYTES_PER_S = 20e9
"""Effective host memory bandwidth one GPU's share of a CPU optimizer step streams at. An
assumption in line with ZeRO-Offload's CPU-Adam (Ren et al. 2021 §4.2, ~1.5 s per step for
10B parameters on a DGX-2 host); calibrate for your hosts."""


OVERLAP_CONTENTION = 0.5
"""Extra compute time per second of communication hidden behind it: NCCL kernels take SMs and
memory bandwidth from the compute they overlap (assumption of the order reported for
overlapped collectives, e.g. Wang et al. 2023 "Overlap communication with dependent
computation via decomposition", and Jangda et al. 2022 "Breaking the computation and
communication abstraction barrier"; fitted on the published runs' training rows:
`benchmarks/fit_constants.py`, docs/validation.md)."""


def hidden_behind(comm_s: float, compute_s: float, contention: float = OVERLAP_CONTENTION) -> float:
    """Exposed seconds of `comm_s` run alongside `compute_s` of compute: what does not fit
    under it, plus the slowdown of the compute it does hide under (`contention`: the
    assumption `OVERLAP_CONTENTION`, or what `paraplan calibrate` measured)."""
    hidden = min(comm_s, compute_s)
    return comm_s - hidden + contention * hidden


class UnitFigures(Protocol):
    """The calibration's figures `FsdpHost.of` reads (`Calibration` has them)."""

    @property
    def fsdp_unit_host_s(self) -> float: ...
    @property
    def fsdp_tensor_host_s(self) -> float: ...
    @property
    def time_scale(self) -> float: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class FsdpHost:
    """What FSDP2 adds to each unit beside its collectives, on the compute stream (GPU) or in
    the training thread (CPU): not hidden under other compute."""

    unit_s: float = 0.0
    """Fixed seconds per unit and micro-batch: hooks and bookkeeping (measured by `paraplan
    calibrate` on small units, `fsdp_unit_host_s`; 0 on catalog devices)."""
    tensor_s: float = 0.0
    """Seconds per parameter tensor of a unit and micro-batch (`fsdp_tensor_host_s`)."""
    copy_s_per_byte: float = 0.0
    """Seconds per byte (read + written) of the copies `fsdp_copy_bytes` counts: the
    device's streaming rate (calibrated elementwise bandwidth, else the datasheet's)."""
    on_host: bool = False
    """Whether the collectives' copy-ins run in the training thread too (a host CPU, where
    FSDP2's side streams are the one thread), not on side streams."""

    @classmethod
    def of(cls, kernels: Kernels | None, acc: Accelerator, cal: UnitFigures | None) -> FsdpHost:
        """The device's: copies at its kernels' streaming rate (else the datasheet's), the
        fixed cost as calibrated (0 on a catalog device)."""
        copy_s = kernels.elementwise_s(1.0) if kernels else 1 / acc.memory_bw_bytes_per_s
        if cal is None:
            return cls(copy_s_per_byte=copy_s, on_host=acc.is_host)
        return cls(
            unit_s=cal.fsdp_unit_host_s * cal.time_scale,
            tensor_s=cal.fsdp_tensor_host_s * cal.time_scale,
            copy_s_per_byte=copy_s,
            on_host=acc.is_host,
        )


def fsdp_units(stage: Stage, t: TrainConfig) -> int:
    """FSDP units of a stage: one per block, and the embedding and head as one root unit
    (`Runtime.fsdp_shared_root`, the executor's) or as one unit each (torchtitan's)."""
    ends = int(stage.has_embedding) + int(stage.has_head)
    if t.runtime.fsdp_shared_root:
        ends = min(ends, 1)
    return max(1, stage.n_blocks + ends)


DDP_BUCKET_BYTES = 25 * 2**20
"""Gradient bucket of DDP / ZeRO-1/2 reduction (PyTorch DDP default `bucket_cap_mb=25`)."""
DDP_FIRST_BUCKET_BYTES = 2**20
"""DDP's first gradient bucket (torch `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB): the
gradients backward produces first go out early; the rest in `DDP_BUCKET_BYTES` buckets."""


def ddp_last_bucket_bytes(layers: Sequence[LayerCost], grad_bytes: float) -> float:
    """Gradient bytes in torch DDP's last bucket. DDP fills its buckets in the order backward
    produces the gradients (rebuilt so after the first step), a tensor at a time, closing a
    bucket once it holds 1 MiB (the first) or 25 MiB: each closes past its cap by part of a
    tensor, and the last holds what remains, the first layers' gradients (Li et al. 2020,
    PyTorch DDP §3.2.3; torch `_compute_bucket_assignment_by_size`), from the traced tensor
    sizes (`LayerCost.param_tensor_sizes`; a layer not traced counts as one tensor)."""
    size = closed = 0.0
    cap = DDP_FIRST_BUCKET_BYTES
    for layer in reversed(layers):
        sizes = layer.param_tensor_sizes or (layer.params,) * bool(layer.params)
        for numel in reversed(sizes):
            size += numel * grad_bytes
            if size >= cap:
                size, closed, cap = 0.0, size, DDP_BUCKET_BYTES
    return size or closed


def ddp_buckets_s(
    grad_bytes: float, last_bytes: float, coll: Collectives, link: AxisLink
) -> tuple[float, float]:
    """(all-reduce seconds of the buckets that can overlap the backward, of the last one) for
    torch DDP's `grad_bytes` of gradients (Li et al. 2020, §3.2.3 and §4.2.3): a bucket goes
    out once backward has produced all its gradients, one after the other; the last
    (`last_bytes`, `ddp_last_bucket_bytes`) holds the first layers' gradients (the
    embedding's, produced last) and starts when backward ends: not hidden at all. A model
    under 1 MiB of gradients (GPT-2 tiny's 0.96 MB) is one bucket, reduced after its
    backward."""
    last = min(last_bytes, grad_bytes) if last_bytes > 0 else grad_bytes
    early_bytes = grad_bytes - last
    buckets = max(1, round(early_bytes / DDP_BUCKET_BYTES))
    early = buckets * coll.all_reduce(early_bytes / buckets, link) if early_bytes > 0 else 0.0
    return early, coll.all_reduce(last, link)


def fsdp_copy_bytes(unit_params: float, shard_ranks: int, t: TrainConfig, on_host: bool) -> float:
    """Bytes (read + written) FSDP2's own copies stream per ZeRO-3 unit and micro-batch where
    nothing hides them (torch 2.13, `distributed/fsdp/_fully_shard/_fsdp_collectives.py`):
    - each of the two gathers' copy-out (`foreach_all_gather_copy_out`: `split_with_sizes_copy`
      of the gathered buffer into the unsharded parameters), on the default stream;
    - on a host CPU also what a GPU runs on side streams: each gather's copy-in (the shard into
      the flat input, `_foreach_copy_`, after the cast of the fp32 shard to the working dtype
      under mixed precision) and the reduce-scatter's copy-in (`_chunk_cat` of the unsharded
      gradients into the flat input, in the reduce dtype).
    fp32 and bf16 reduce with AVG, so no division passes (`_get_gradient_divide_factors`).
    Measured in the training thread's CPU time on 2 gloo ranks (4 fully_shard-ed Linear units
    of 4.2M and 16.8M fp32 parameters, 2026-11-26): 1.83 ns per parameter beyond the plain
    modules' step; this counts 32 B per parameter, 1.9 ns at the VM's 17 GB/s."""
    e_p, e_r, gathers = t.param_bytes, t.grad_bytes, 2
    total = gathers * 2 * unit_params * e_p
    if on_host:
        shard = unit_params / max(1, shard_ranks)
        cast = shard * (FP32_BYTES + e_p) if e_p != FP32_BYTES else 0.0
        total += gathers * (2 * shard * e_p + cast) + unit_params * (e_p + e_r)
    return total


def gathered_bytes(t: TrainConfig, stage: Stage, *, experts: bool = False) -> float:
    """Bytes per parameter ZeRO all-gathers on `stage` (ZeRO-3's per unit, ZeRO-1/2's after
    the step), averaged over its dense parameters (`experts`: over its experts', all in the
    blocks): the working precision's, but one for the blocks' weights under fp8 with fp8
    all-gathers (`Runtime.fp8_all_gather`; the embedding and the head stay bf16, as does a
    block's few norm weights)."""
    if not (t.precision == Precision.FP8 and t.runtime.fp8_all_gather):
        return float(t.param_bytes)
    if experts:
        return 1.0
    if not stage.dense_params:
        return float(t.param_bytes)
    in_blocks = min(1.0, stage.n_blocks * stage.max_block_params / stage.dense_params)
    return in_blocks * 1.0 + (1.0 - in_blocks) * t.param_bytes


def dp_comm(
    s: Strategy,
    stage: Stage,
    links: Links,
    coll: Collectives,
    t: TrainConfig,
    fwd: float,
    bwd: float,
    powersgd: PowerSGDModel | None = None,
    contention: float = OVERLAP_CONTENTION,
    fsdp: FsdpHost | None = None,
    ddp_last_bytes: float = 0.0,
) -> tuple[float, float]:
    """(exposed seconds per micro-batch, exposed seconds once per step) of ZeRO/DDP traffic
    for one stage; `fwd`/`bwd` are the stage's compute seconds per micro-batch.

    - DDP and ZeRO-1/2: gradients are reduced in buckets as the last micro-batch's backward
      produces them (Li et al. 2020, PyTorch DDP §3.2.3), so the reduction hides under that
      backward; ZeRO-2 reduce-scatters every micro-batch. Parameters are gathered after the
      optimizer step (ZeRO-1/2), hidden under the next forward at best.
    - ZeRO-3/FSDP as it runs (Zhao et al. 2023, PyTorch FSDP §3.3-3.4): one all-gather per unit
      (a block; the embedding and head are units too) before its forward and again before its
      backward, and one reduce-scatter of its gradients after it, each with its own latency.
      Prefetching overlaps a unit's gather only with its neighbour's compute, so each unit
      exposes what its collectives take beyond one unit of compute, and the first gather and
      the last reduce-scatter of each pass are not hidden at all. This repeats every
      micro-batch: small micro-batches over large groups expose communication.
    - HSDP (`dp_shard` < dp; Zhao et al. 2023 §3.2.2): the dense units gather and
      reduce-scatter inside the shard group, and each unit's gradient shard is then
      all-reduced across the replica groups, every micro-batch (FSDP2 syncs each backward
      unless told otherwise).
    - PowerSGD (`s.powersgd_rank`, DDP and ZeRO-1 only; `compression.py`): the compressed
      all-reduces overlap the last backward as the buckets' hook runs; its compute does not.
    """
    per_mb = tail = 0.0
    dense_link = links.shard if s.zero_stage == 3 else links.dpcp
    groups = (
        (stage.dense_params / s.tp, dense_link),
        (stage.expert_params / (s.tp * s.ep_dp), links.edp),
    )
    units = fsdp_units(stage, t)
    if fsdp is not None and fsdp.tensor_s and s.zero_stage == 3 and s.fsdp_wrapped:  # per tensor
        per_mb += fsdp.tensor_s * stage.param_tensors
    for (count, link), experts in zip(groups, (False, True), strict=True):
        if fsdp is not None and count and s.zero_stage == 3 and s.fsdp_wrapped:
            # FSDP2's hooks and copies, over one shard rank too: not hidden (`FsdpHost`)
            copies = fsdp_copy_bytes(count / units, link.size, t, fsdp.on_host)
            per_mb += units * (fsdp.unit_s + copies * fsdp.copy_s_per_byte)
        if not count or link.size <= 1:
            continue
        gathered = gathered_bytes(t, stage, experts=experts)
        if s.zero_stage == 3:
            unit = count / units
            ag = coll.all_gather(unit * gathered, link)
            rs = coll.reduce_scatter(unit * t.grad_bytes, link)
            if link is dense_link and links.replicate.size > 1:
                rs += coll.all_reduce(unit * t.grad_bytes / link.size, links.replicate)
            fwd_u, bwd_u = fwd / units, bwd / units
            # a unit's forward gather is prefetched only by running ahead of the device
            # (FSDP2's implicit prefetch: stream events, `_fsdp_param_group.wait_for_unshard`);
            # a host CPU's one thread gathers each unit when it gets there and waits for it
            on_host = fsdp is not None and fsdp.on_host
            per_mb += ag + (units - 1) * (ag if on_host else hidden_behind(ag, fwd_u, contention))
            # backward re-gathers the blocks only: the unit backward starts with (the head's,
            # or torch's root: embedding and head) stays gathered from its forward (torch's
            # `fully_shard` default for the root; torchtitan keeps the last block and the
            # output, re-gathering the embedding); each gather is prefetched under the unit
            # before it, each reduce-scatter hides under the next unit's backward
            first = 0.0 if stage.has_head else ag
            hidden_ag = max(0, stage.n_blocks - int(not stage.has_head)) * ag
            if units > 1:
                per_mb += (units - 1) * hidden_behind(
                    rs + hidden_ag / (units - 1), bwd_u, contention
                )
            per_mb += first + rs
            continue
        ag = coll.all_gather(count * gathered, link)  # ZeRO-1/2's, after the step
        rs = coll.reduce_scatter(count * t.grad_bytes, link)
        # overlapped where the runtime overlaps them (`Runtime.grad_reduce_overlap`,
        # `param_gather_overlap`); else exposed after the backward / the optimizer step
        grads_bwd = bwd if t.runtime.grad_reduce_overlap else 0.0
        params_fwd = fwd if t.runtime.param_gather_overlap else 0.0
        if powersgd is not None and s.powersgd_rank is not None and link is dense_link:
            ps = powersgd.cost(s, stage, link, coll, t)  # DDP's hook in place of the all-reduce
            tail += hidden_behind(ps.comm_s, bwd, contention) + ps.compute_s
            tail += hidden_behind(ag, params_fwd, contention) if s.zero_stage == 1 else 0.0
        elif s.zero_stage == 2:  # reduce-scatter every micro-batch, gather after the step
            per_mb += hidden_behind(rs, grads_bwd, contention)
            tail += hidden_behind(ag, params_fwd, contention)
        elif s.zero_stage == 1:  # reduce-scatter once per step, gather after the step
            tail += hidden_behind(rs, grads_bwd, contention)
            tail += hidden_behind(ag, params_fwd, contention)
        elif s.tp == 1 and s.pp == 1 and link is dense_link:  # torch DDP, in buckets
            early, last = ddp_buckets_s(count * t.grad_bytes, ddp_last_bytes, coll, link)
            tail += hidden_behind(early, grads_bwd, contention) + last
        else:  # all-reduce once per step, overlapped with the last backward
            all_reduce = coll.all_reduce(count * t.grad_bytes, link)
            tail += hidden_behind(all_reduce, grads_bwd, contention)
    return per_mb, tail


def optimizer_shard_params(s: Strategy, stage: Stage) -> float:
    """Parameters whose optimizer states one rank of `stage` updates."""
    dpcp = s.dp * s.cp if s.zero_stage >= 1 else 1
    edp = dpcp // s.ep_dp if s.zero_stage >= 1 else 1  # experts shard over dp*cp/ep
    dense_ranks = dpcp // s.dp_replicate  # HSDP: the shard group's ranks
    return stage.dense_params / s.tp / dense_ranks + stage.expert_params / (s.tp * s.ep_dp) / edp


def optimizer_s(
    s: Strategy,
    stage: Stage,
    t: TrainConfig,
    acc: Accelerator,
    *,
    host_s_per_param: float = 0.0,
) -> float:
    """Optimizer step: memory-bound over the rank's shard of states (read and write), or on
    the host with the gradient/parameter PCIe transfers (Ren et al. 2021 §4); the host's
    update at `host_s_per_param` when measured (`Calibration.host_adamw_s_per_param`), else
    at the assumed `HOST_OPTIMIZER_BYTES_PER_S`."""
    shard = optimizer_shard_params(s, stage)
    state_bytes = shard * (t.param_bytes + t.grad_bytes + t.optimizer_bytes)
    if not s.offload_optimizer:
        return 2 * state_bytes / acc.memory_bw_bytes_per_s
    # gradients to the host, updated parameters back, once per step; under ZeRO-2 the fp32
    # parameters go back with each micro-batch's gather instead (`offload.OffloadModel.cost`)
    back = 0 if s.zero_stage == 2 else t.param_bytes
    pcie = shard * (t.grad_bytes + back) / acc.pcie_bw_bytes_per_s
    if s.offload_params:  # the shards already live on the host (copies priced in offload.py)
        pcie = 0.0
    if host_s_per_param > 0:
        return pcie + shard * host_s_per_param
    return pcie + 2 * state_bytes / HOST_OPTIMIZER_BYTES_PER_S
