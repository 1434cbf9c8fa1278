"""Offload beyond the optimizer, CPU only (no NVMe): parameters and activations.

- Parameters (ZeRO-Offload, Ren et al. 2021 §4; ZeRO-Infinity, Rajbhandari et al. 2021 §5,
  CPU tier only), as FSDP2's `CPUOffloadPolicy` runs it under ZeRO-3: each rank's parameter
  and gradient shards live on the host. Before every all-gather of a unit (forward, and again
  for backward) its parameter shard is copied host-to-device, and after every reduce-scatter
  its gradient shard device-to-host; the optimizer step runs on the host (so optimizer
  offload is implied). GPU memory keeps only the unsharded units in flight.
- Optimizer offload under ZeRO-2 as the executor runs it (FSDP2's `CPUOffloadPolicy`): the
  fp32 parameter shards live on the host beside the optimizer states, so each micro-batch's
  gather of a unit first copies its fp32 shard host-to-device (kept through backward); the
  gradients go back once per step (`data_parallel.optimizer_s`). Under ZeRO-3 the executor
  runs the same policy, priced as parameter offload above when `offload_params` is pinned
  (without it the parameters' copies are priced once per step: a gap left open). Priced per
  step only, a 1.24B Llama on an H200 (4 micro-batches) measured 0.51 s over its prediction
  (2026-11-26): these copies, 4 x 5 GB at 55 GB/s, run longer than the forward they hide
  behind.
- Activations (vDNN, Rhu et al. 2016; the executor's saved-tensor offload): what each block
  keeps for backward is copied to the host during forward and back before its backward. GPU
  memory keeps two blocks' worth per stage (the block being copied out or in, and the next:
  double buffering) instead of every block of every in-flight micro-batch.

Transfers use the accelerator's host link (`Accelerator.pcie_bw_bytes_per_s`, one direction;
both kinds share it). A copy overlaps only with its neighbouring unit's compute, as FSDP's
prefetch and vDNN's prefetch do, and overlapped compute runs slower (`hidden_behind`:
contention); the first copy of each pass is not hidden. Over a shard group of one rank no
parameter copy is hidden: FSDP2 then skips the all-gather and copies each unit's shard in
`FSDPParamGroup.wait_for_unshard` on the compute stream (torch 2.11-2.13,
`_fsdp_param_group.py`, the `world_size == 1` path), as an H200 showed (2026-11-26: a 1.24B
Llama's 359 ms of copies per step added to its compute, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import FP32_BYTES, TrainConfig
from ..hardware import Accelerator
from ..model import LayerKind
from ..strategy import Strategy
from .data_parallel import fsdp_units, hidden_behind
from .layout import Stage
from .memory import MemoryBreakdown
from .stage_parts import StageCompute
from .stages import Policy, StageModel

ACTIVATION_BUFFERS = 2
"""Blocks' activations kept on the GPU under activation offload: one being copied, one being
computed (vDNN's double buffering, Rhu et al. 2016 §3.3)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadCost:
    """PCIe traffic of one stage's rank per micro-batch, and what it exposes."""

    param_bytes: float
    """Parameter shards copied host-to-device (twice per unit) and gradient shards back."""
    activation_bytes: float
    """Activations copied to the host and back."""
    exposed_s: float
    """Seconds of those copies not hidden under neighbouring compute (with contention)."""

    @property
    def pcie_bytes(self) -> float:
        """All bytes over the host link per micro-batch."""
        return self.param_bytes + self.activation_bytes


class OffloadModel:
    """Prices parameter and activation offload for one stage model."""

    def __init__(self, stage_model: StageModel, train: TrainConfig, acc: Accelerator) -> None:
        self.sm, self.train, self.acc = stage_model, train, acc
        self._is_block = [x.kind == LayerKind.BLOCK for x in stage_model.profile.layers]
        self._block_bytes: dict[tuple, tuple[Stage, float, float]] = {}

    def block_act_bytes(self, s: Strategy, stage: Stage, policy: Policy) -> tuple[float, float]:
        """(bytes all blocks of the stage keep per sequence, the largest block's) under the
        activation policy (memoized by the stage's id; the memo keeps the stage alive, so its
        id is not reused)."""
        key = (id(stage), s.tp, s.sequence_parallel, s.cp, policy)
        found = self._block_bytes.get(key)
        if found is not None:
            return found[1], found[2]
        prefix, _, _ = self.sm.act_prefix(s.tp, s.sequence_parallel, s.cp, policy)
        is_block = self._is_block
        per_block = [
            prefix[i + 1] - prefix[i]
            for c in stage.chunks
            for i in range(c.first_layer, c.last_layer + 1)
            if is_block[i]
        ]
        total, largest = sum(per_block), max(per_block, default=0.0)
        self._block_bytes[key] = (stage, total, largest)
        return total, largest

    def memory(
        self, s: Strategy, stage: Stage, mem: MemoryBreakdown, inflight: float, policy: Policy
    ) -> MemoryBreakdown:
        """`mem` (the stage's memory without offload) with the offloaded parts moved off the
        GPU: parameter and gradient shards (and optimizer states) under parameter offload
        (beside a pipeline whole parameters and gradients stay on the GPU through the step:
        `memory.held_zero_stage`); every block's kept activations but `ACTIVATION_BUFFERS`
        blocks' under activation offload."""
        if s.offload_params and s.pp == 1:
            mem = replace(mem, params_bytes=0.0, grads_bytes=0.0, optimizer_bytes=0.0)
        if s.offload_activations:
            blocks, largest = self.block_act_bytes(s, stage, policy)
            moved = blocks * inflight - ACTIVATION_BUFFERS * largest
            acts = mem.activations_bytes - max(0.0, moved) * s.micro_batch_size
            mem = replace(mem, activations_bytes=max(0.0, acts))
        return mem

    def cost(self, s: Strategy, stage: Stage, c: StageCompute, policy: Policy) -> OffloadCost:
        """Copies per micro-batch and their exposed seconds for one stage."""
        t, bw = self.train, self.acc.pcie_bw_bytes_per_s
        units = fsdp_units(stage, t)
        fwd_u, bwd_u = c.fwd_s / units, c.bwd_s / units
        fwd_param = bwd_param = fwd_act = bwd_act = 0.0  # bytes per unit, per pass
        param_bytes = act_bytes = 0.0
        ranks = max(1, s.dp * s.cp // s.dp_replicate)
        shard = (stage.dense_params / s.tp + stage.expert_params / (s.tp * s.ep_dp)) / ranks
        if s.offload_params:
            param_bytes = shard * (2 * t.param_bytes + t.grad_bytes)
            fwd_param = shard * t.param_bytes / units
            bwd_param = shard * (t.param_bytes + t.grad_bytes) / units
        elif s.offload_optimizer and s.zero_stage == 2:  # the executor's (module docstring)
            param_bytes = shard * FP32_BYTES
            fwd_param = shard * FP32_BYTES / units
        if s.offload_activations and stage.n_blocks:
            blocks, _ = self.block_act_bytes(s, stage, policy)
            act_bytes = 2 * blocks * s.micro_batch_size
            fwd_act = bwd_act = blocks * s.micro_batch_size / units
        if ranks == 1:  # FSDP2 unshards a one-rank group on the compute stream: never hidden
            serial_s = units * (fwd_param + bwd_param) / bw
            fwd_param = bwd_param = 0.0
        else:
            serial_s = 0.0
        f, b = (fwd_param + fwd_act) / bw, (bwd_param + bwd_act) / bw
        exposed = serial_s
        if f or b:  # the first copy of each pass waits; the others hide under a neighbour
            exposed += f + b + (units - 1) * (hidden_behind(f, fwd_u) + hidden_behind(b, bwd_u))
        return OffloadCost(param_bytes=param_bytes, activation_bytes=act_bytes, exposed_s=exposed)


def offload_problem(s: Strategy) -> str | None:
    """Why the strategy's offload choices cannot be priced (None when they can)."""
    if s.offload_params and (s.zero_stage != 3 or not s.offload_optimizer):
        return (
            f"offload_params with zero_stage={s.zero_stage}, offload_optimizer="
            f"{str(s.offload_optimizer).lower()}: parameter offload shards parameters on the "
            "host (FSDP2 CPUOffloadPolicy, ZeRO-3) and runs the optimizer there; use --fix "
            "zero=3,offload=true,offload_params=true"
        )
    return None
