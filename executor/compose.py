"""`parallelize(model, plan)`: apply a plan inside a torchrun process, in one fixed order.

0. check the plan against the job and the model (no collective yet), convert the model to a
   chain (embedding, blocks, head);
1. process group (bounded timeout) and the plan's DeviceMesh; check the weights agree;
2. pipeline split: keep this rank's chunks (first, so each rank parallelizes only the layers it
   runs, as torchtitan splits before parallelizing each part);
3. tensor parallel, with sequence parallel when planned, and the vocab-parallel embedding and
   head (the loss on vocab-sharded logits, on the last pipeline stage under PP);
4. context parallel: ring attention over the cp axis, load-balanced causal sequence split;
5. expert parallel: MoE experts sharded over ep consecutive dp ranks, all-to-all dispatch;
6. activation checkpointing per layer, then activation offload per layer (`offload.py`);
7. data parallel over dp (x cp): FSDP2 (ZeRO-2/3, HSDP, mixed precision, offload) or DDP
   (ZeRO-0, and ZeRO-1 with the sharded optimizer of `optim.py`);
8. pipeline stages and the planned schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from ..planner.plan import Plan
from ..planner.strategy import MeshAxis
from . import checks, pipeline
from . import mesh as meshes
from .chain import ChainModule, TPPlanFn, causal_lm_loss
from .context_parallel import ContextShard, apply_cp
from .convert import to_chain_module
from .data_parallel import (
    PARAM_DTYPES,
    DataParallelKind,
    apply_data_parallel,
    data_parallel_kind,
    data_parallel_mesh,
)
from .expert_parallel import ExpertGrads, apply_ep, expert_params
from .offload import apply_activation_offload, layer_offload
from .recompute import apply_recompute, layer_recompute
from .tensor_parallel import apply_tp

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelModel:
    """A model with a plan applied: this rank's chunks, wrapped, and how to run a step."""

    plan: Plan
    """The plan applied."""
    mesh: DeviceMesh
    """The plan's device mesh."""
    dp_mesh: DeviceMesh
    """The mesh data parallelism runs over: dp (x cp), 2-D (replicate, shard) under HSDP."""
    context: ContextShard | None
    """This rank's place on the context-parallel ring (None without CP)."""
    experts: ExpertGrads | None
    """The expert gradients' reduction (None without EP)."""
    vocab_parallel: bool
    """Whether the logits are sharded over the vocabulary (the loss and its backward run
    under `loss_parallel`)."""
    device: torch.device
    """Where this rank computes."""
    chains: tuple[ChainModule, ...]
    """This rank's chain chunks (the whole chain without a pipeline), in model order."""
    parts: tuple[nn.Module, ...]
    """The same chunks as run: FSDP modules, DDP wrappers, or the chains themselves."""
    schedule: object | None
    """The pipeline schedule (None without a pipeline)."""
    tied: pipeline.TiedCopies
    """Embedding/head copies whose gradients are summed after backward (pipeline only)."""
    autocast_dtype: torch.dtype | None
    """Compute dtype under `torch.autocast` when no FSDP policy casts (bf16 with DDP)."""
    loss_fn: LossFn
    """Loss of logits against labels, averaged over tokens."""

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel coordinate (which slice of the global batch it takes)."""
        return meshes.axis_rank(self.mesh, MeshAxis.DP)

    @property
    def is_first_stage(self) -> bool:
        """Whether this rank feeds the token ids (holds the embedding)."""
        return self.chains[0].embed is not None

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank computes the loss (holds the head)."""
        return self.chains[-1].head is not None

    def local_batch(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch (global_batch, T): its data-parallel replica's
        rows, and under context parallelism its two chunks of each sequence (B, T/cp)."""
        rows = tokens.shape[0] // self.plan.parallelism.dp
        if rows * self.plan.parallelism.dp != tokens.shape[0]:
            raise ValueError(
                f"a global batch of {tokens.shape[0]} sequences does not split over "
                f"dp={self.plan.parallelism.dp}; use the plan's global batch "
                f"{self.plan.train.global_batch}"
            )
        mine = tokens[self.dp_rank * rows : (self.dp_rank + 1) * rows]
        if self.context is not None:
            mine = self.context.shard(mine)  # (B, T/cp)
        return mine.to(self.device)

    def parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of this rank's chunks."""
        for part in self.parts:
            yield from part.parameters()

    def forward_backward(
        self, input_ids: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor | None:
        """Forward and backward of this replica's batch (B, T) split into the plan's
        micro-batches; gradients are those of the mean loss. Returns the mean loss, or None
        on pipeline ranks without the head."""
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (input_ids.to(self.device),) if self.is_first_stage else ()
            target = labels.to(self.device) if self.is_last_stage else None
            with self._autocast(), self._loss_context():
                # return_outputs=False: by default the last stage keeps every micro-batch's
                # logits and concatenates them at the end (torch/distributed/pipelining/
                # stage.py `output_chunks`), 2 x the micro-batches' logits held at its peak
                # (measured: +144 MiB on gpt-small's pp=2 head stage, fp32, 4 micro-batches)
                self.schedule.step(  # type: ignore[attr-defined]
                    *args, target=target, losses=losses, return_outputs=False
                )
            self.tied.sync_grads()
            if not self.is_last_stage:
                return None
            # replicated DTensors under loss_parallel
            full = [v.full_tensor() if isinstance(v, DTensor) else v for v in losses]
            return torch.stack(full).mean().detach()
        (part,) = self.parts
        n = self.plan.num_microbatches
        par = self.plan.parallelism
        # gradients sharded over two ranks or more (FSDP2's shard dimension: the last)
        sharded = data_parallel_kind(self.plan) == DataParallelKind.FSDP and (
            self.dp_mesh.shape[-1] > 1
        )
        offload = par.offload_optimizer or par.offload_params
        gathered = sharded and par.zero_stage == 2 and not offload
        total = torch.zeros((), device=self.device)
        xs, ys = input_ids.to(self.device).chunk(n), labels.to(self.device).chunk(n)
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            with _grad_sync(part, i == n - 1, sharded, gathered), self._loss_context():
                with self._autocast():
                    loss = self.loss_fn(part(x), y) / n  # x (b, T) -> logits (b, T, V)
                loss.backward()
            value = loss.detach()  # a replicated DTensor under loss_parallel
            total += value.full_tensor() if isinstance(value, DTensor) else value
        if self.experts is not None:
            self.experts.sync_grads()
        return total

    def _loss_context(self) -> contextlib.AbstractContextManager[object]:
        """`loss_parallel` for vocab-sharded logits (forward and backward of the loss)."""
        return loss_parallel() if self.vocab_parallel else contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def named_tensors(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Full (gathered) parameters or gradients of this rank's chunks by chain name; a
        collective over the data- and tensor-parallel groups (call it on every rank)."""
        out: dict[str, torch.Tensor] = {}
        for chain in self.chains:
            for name, p in chain.named_parameters():
                t = p if kind == "param" else p.grad
                if t is None:
                    continue
                out[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
        return out


@contextlib.contextmanager
def _grad_sync(part: nn.Module, sync: bool, sharded: bool, gathered: bool) -> Iterator[None]:
    """Reduce gradients only on the last micro-batch of gradient accumulation where they are
    replicated (DDP, `replicate`). Sharded gradients (FSDP2, ZeRO-2/3) are reduce-scattered
    after every micro-batch, as DeepSpeed's ZeRO and torchtitan do and the planner prices:
    skipping it keeps the whole model's unsharded gradients on every rank until the last
    micro-batch (8 fully_shard-ed 1024x1024 layers on 2 gloo ranks, torch 2.13: 32 MiB of
    unsharded gradients held without the sync, 16 MiB of shards with it). Over one shard rank
    nothing is sharded and gradients are reduced once (as measured on an H200 with optimizer
    offload). Under ZeRO-2 without offload (`gathered`: parameters kept whole through the
    step, as priced) they are resharded only after the last micro-batch, so the step gathers
    them once, not once per micro-batch; with offload each micro-batch copies the fp32
    shards in again (`planner/cost/offload.py` prices that)."""
    if isinstance(part, DistributedDataParallel) and not sync:
        with part.no_sync():
            yield
        return
    if isinstance(part, FSDPModule):
        part.set_requires_gradient_sync(sync or sharded)
        if gathered:
            part.set_reshard_after_backward(sync)
    yield


def parallelize(
    model: nn.Module,
    plan: Plan,
    *,
    mesh: DeviceMesh | None = None,
    tp_plan: TPPlanFn | None = None,
    loss_fn: LossFn = causal_lm_loss,
    timeout_s: float = meshes.DEFAULT_TIMEOUT_S,
) -> ParallelModel:
    """Apply `plan` to `model` (a Hugging Face GPT-2 or Llama causal LM, or a `ChainModule`) in this
    torchrun process. The model must hold the same weights on every rank (same seed; checked);
    it is modified in place. `tp_plan` overrides the block TP plan; `mesh`, when given, must
    have the plan's axes and sizes; `timeout_s` bounds every collective's wait for a peer.
    Raises ValueError, before any collective, when the plan does not fit the job or model."""
    par = plan.parallelism
    # 0. checks without communication, and the chain view of the model
    device_type = meshes.plan_device_type(plan)
    checks.check_plan_supported(plan)
    checks.check_job(plan, world_size=meshes.job_world_size(), device_type=device_type)
    checks.check_module_digest(plan, model)
    chain = to_chain_module(model)
    checks.check_model(plan, chain, num_blocks=chain.num_blocks)
    if par.pp > 1:
        pipeline.check_layout(plan, chain.num_blocks)
    # vocab-sharded logits need the default loss (cross-entropy), which the last pipeline
    # stage computes inside the schedule (under `loss_parallel`, forward and backward)
    vocab_parallel = par.tp > 1 and loss_fn is causal_lm_loss
    vocab_parallel = vocab_parallel and chain.vocab is not None
    # 1. process group (bounded timeout) and the plan's mesh; same weights on every rank
    meshes.init_distributed(device_type, timeout_s=timeout_s)
    mesh = meshes.build_mesh(plan, device_type) if mesh is None else meshes.check_mesh(mesh, plan)
    device = meshes.local_device(device_type)
    checks.check_same_weights(chain, device)
    dp_mesh = data_parallel_mesh(mesh, plan)
    context = context_shard(mesh) if par.cp > 1 else None
    ep_meshes = expert_meshes(mesh, plan) if par.ep > 1 else None
    # 2. pipeline split: this rank's chunks on its device, the others' layers freed
    chunks, tied = pipeline.split(chain, plan, mesh, device)
    parts: list[tuple[int, nn.Module]] = []
    experts: ExpertGrads | None = None
    for index, part in chunks:
        # 3. tensor parallel (sequence parallel when planned), vocab-parallel embedding/head
        if par.tp > 1:
            apply_tp(
                part,
                mesh[str(MeshAxis.TP)],
                sequence_parallel=par.sequence_parallel,
                heads=plan.model.heads,
                kv_heads=plan.model.kv_heads,
                tp_plan=tp_plan,
                shard_logits=vocab_parallel,
            )
        # 4. context parallel: ring attention, global positions of this rank's chunks
        if context is not None:
            apply_cp(part, context)
        # 5. expert parallel: this rank's experts, all-to-all dispatch and combine
        if ep_meshes is not None:
            experts = apply_ep(part, ep_meshes[0], ep_meshes[1].get_group(), dp=par.dp)
        # 6. activation checkpointing, per layer
        apply_recompute(part, layer_recompute(plan))
        apply_activation_offload(part, layer_offload(plan))
        # 7. data parallel: FSDP2 / replicate in place, or a DDP wrapper (experts left out)
        dp_part = apply_data_parallel(part, dp_mesh, plan, ignored=expert_params(part))
        parts.append((index, dp_part))
    # 8. pipeline stages and the planned schedule
    schedule = None
    if par.pp > 1:
        schedule = pipeline.build_schedule(plan, parts, mesh[str(MeshAxis.PP)], loss_fn, device)
    kind = data_parallel_kind(plan)
    return ParallelModel(
        plan=plan,
        mesh=mesh,
        dp_mesh=dp_mesh,
        context=context,
        experts=experts,
        vocab_parallel=vocab_parallel,
        device=device,
        chains=tuple(c for _, c in chunks),
        parts=tuple(m for _, m in parts),
        schedule=schedule,
        tied=tied,
        loss_fn=loss_fn,
        autocast_dtype=PARAM_DTYPES[plan.train.precision] if kind.autocasts else None,
    )


def context_shard(mesh: DeviceMesh) -> ContextShard:
    """This rank's context-parallel ring: the cp axis of the plan's mesh."""
    cp_mesh = mesh[str(MeshAxis.CP)]
    group = cp_mesh.get_group()
    ranks = tuple(dist.get_process_group_ranks(group))
    return ContextShard(group=group, ranks=ranks, rank=cp_mesh.get_local_rank())


def expert_meshes(mesh: DeviceMesh, plan: Plan) -> tuple[DeviceMesh, DeviceMesh]:
    """(EP mesh, expert-replica mesh): the dp axis as (dp/ep, ep), ep consecutive dp ranks
    in one EP group (a collective: it creates the groups)."""
    dp, ep = plan.parallelism.dp, plan.parallelism.ep
    both = meshes.split_axis(mesh, MeshAxis.DP, (dp // ep, ep), ("ep_replica", "ep"))
    return both["ep"], both["ep_replica"]
