"""Expert parallelism for Hugging Face Mixtral-style MoE blocks.

The EP group is ep consecutive data-parallel ranks (expert parallelism lives inside dp, as the
planner prices it). Each rank keeps experts [r*E/ep, (r+1)*E/ep) of every MoE block as DTensor
shards (Shard(0) over the ep axis, so checkpoints and gathered tensors keep the full expert
dimension). The router is unchanged and runs on every rank's own tokens; each (token, expert)
assignment travels to the rank holding the expert by all-to-all (dispatch), the expert FFN runs
there, and the result comes back by the inverse all-to-all (combine), where it is weighted by
the router's score and summed per token (Lepikhin et al. 2020, GShard §2.2; Fedus et al. 2021).

Expert gradients: rank r's experts see the tokens of its whole EP group, so their gradient is
that group's sum; the dp/ep EP groups hold the same experts (replicas), so `ExpertGrads`
all-reduces over those replicas and divides by dp, which gives the gradient of the mean loss
over the global batch (data parallelism averages the other parameters over dp). The experts
are left out of FSDP/DDP (`ignored_params`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from .chain import ChainModule


class ExpertParallelExperts(nn.Module):
    """This rank's experts of one MoE block, fed by all-to-all (Mixtral's `experts` module:
    same parameter names and the same forward signature)."""

    def __init__(self, experts: Any, ep_mesh: DeviceMesh) -> None:
        super().__init__()
        ep, r = ep_mesh.size(), ep_mesh.get_local_rank()
        self.num_experts = int(experts.num_experts)
        if self.num_experts % ep:
            raise ValueError(
                f"ep={ep} must divide the experts per block ({self.num_experts}); re-plan with "
                "an ep that divides it"
            )
        self.local = self.num_experts // ep
        self.first = r * self.local
        """Index of this rank's first expert."""
        self.group = ep_mesh.get_group()
        self.act_fn = experts.act_fn
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name).detach()  # (E, ., .)
            mine = full[self.first : self.first + self.local].clone()  # (E/ep, ., .)
            setattr(self, name, nn.Parameter(DTensor.from_local(mine, ep_mesh, [Shard(0)])))

    def forward(
        self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden (N, H), top_k_index and top_k_weights (N, k) -> (N, H): the weighted sum of
        each token's experts' outputs."""
        n, k = top_k_index.shape
        ep = dist.get_world_size(self.group)
        flat = top_k_index.reshape(-1)  # (N*k,) expert of each assignment
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert
        token = order // k  # (N*k,) token of each sorted assignment
        expert = flat[order]  # (N*k,)
        send = torch.bincount(expert // self.local, minlength=ep)  # assignments per rank
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        got_expert = expert.new_empty(sum(recv_sizes))
        dist.all_to_all_single(got_expert, expert, recv_sizes, send_sizes, group=self.group)
        x = dist_fn.all_to_all_single(
            hidden.new_empty(sum(recv_sizes), hidden.shape[1]),
            hidden[token],
            recv_sizes,
            send_sizes,
            group=self.group,
        )  # (received, H): dispatch
        # fp32 master weights, computed in the activations' dtype (FSDP's mixed precision
        # casts the other parameters; the experts are left out of FSDP)
        gate_up = _local(self.gate_up_proj).to(x.dtype)  # (E/ep, 2F, H)
        down = _local(self.down_proj).to(x.dtype)  # (E/ep, H, F)
        y = torch.zeros_like(x)
        for e in range(self.local):
            rows = torch.nonzero(got_expert == self.first + e).squeeze(1)
            if rows.numel() == 0:
                continue
            gate, up = F.linear(x[rows], gate_up[e]).chunk(2, dim=-1)  # (rows, F) each
            y = y.index_add(0, rows, F.linear(self.act_fn(gate) * up, down[e]))  # (rows, H)
        back = dist_fn.all_to_all_single(
            hidden.new_empty(n * k, hidden.shape[1]), y, send_sizes, recv_sizes, group=self.group
        )  # (N*k, H) in sorted order: combine
        weight = top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)  # (N*k, 1)
        return torch.zeros_like(hidden).index_add(0, token, back * weight)  # (N, H)


def _local(param: object) -> torch.Tensor:
    """This rank's shard of an expert parameter, differentiably (a DTensor's local part)."""
    if not isinstance(param, DTensor):  # set in ExpertParallelExperts.__init__
        raise TypeError(f"expert parameter is a {type(param).__name__}, not the EP DTensor")
    return param.to_local()


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertGrads:
    """Sums the expert gradients over the EP groups that hold the same experts."""

    params: tuple[nn.Parameter, ...]
    """This rank's expert parameters (DTensor shards)."""
    replica_group: dist.ProcessGroup
    """Ranks holding the same experts (one per EP group)."""
    dp: int
    """Data-parallel degree (the gradient is of the mean over dp replicas' losses)."""

    def sync_grads(self) -> None:
        """All-reduce (sum) over the replicas, then divide by dp."""
        for p in self.params:
            if p.grad is None:
                continue
            grad = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
            if dist.get_world_size(self.replica_group) > 1:
                dist.all_reduce(grad, group=self.replica_group)
            grad.div_(self.dp)


def apply_ep(
    chain: ChainModule, ep_mesh: DeviceMesh, replica_group: dist.ProcessGroup, *, dp: int
) -> ExpertGrads:
    """Shard every MoE block's experts over `ep_mesh` (in place); returns the gradient sync."""
    params: list[nn.Parameter] = []
    for key, block in chain.blocks.items():
        moe = next(
            (m for m in block.modules() if hasattr(m, "experts") and hasattr(m, "gate")), None
        )
        if moe is None:
            raise ValueError(
                f"expert parallelism: block {key} of the {chain.family!r} chain has no MoE layer "
                "(a module with `gate` and `experts`, as Hugging Face Mixtral's); re-plan with "
                "--fix ep=1"
            )
        sharded = ExpertParallelExperts(moe.experts, ep_mesh)
        setattr(moe, "experts", sharded)  # noqa: B010
        params += [p for p in sharded.parameters()]
    return ExpertGrads(params=tuple(params), replica_group=replica_group, dp=dp)


def expert_params(chain: ChainModule) -> set[nn.Parameter]:
    """The expert parameters of `chain` (left out of FSDP/DDP)."""
    return {
        p for m in chain.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()
    }
