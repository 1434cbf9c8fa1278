"""DDP's gradients are views of its buckets (no second copy), and the planner prices them so:
whole from the start of backward, with no extra bucket buffers.

Run as a script (``tests/test_ddp_buckets.py``) it is the one-rank gloo worker of the first
test: the process group lives in a child process with a bounded wait, never in the test
session (CI of 2026-11-26 hung in this test for the rest of its 90 minutes, in-process; not
reproduced in 20 runs here since)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from paraplan.executor.data_parallel import apply_ddp
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model_parse import parse_model
from paraplan.planner.strategy import Strategy
from tests.one_rank import child_main, run_child


def _bucket_storage() -> dict[str, int]:
    """One gloo rank: a DDP model's backward, then its gradients' storages (count, bytes)
    against the gradients' own count and bytes."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(32, 32) for _ in range(6)))
        ddp = apply_ddp(model, mesh, ignored=set())
        ddp(torch.randn(4, 32)).sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        storages = {g.untyped_storage().data_ptr(): g for g in grads}
        return {
            "grads": len(grads),
            "params": len(list(model.parameters())),
            "storages": len(storages),
            "storage_bytes": sum(g.untyped_storage().nbytes() for g in storages.values()),
            "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        }
    finally:
        dist.destroy_process_group()


def test_ddp_gradients_share_the_bucket_storage() -> None:
    """Without `gradient_as_bucket_view` each gradient has its own storage beside the
    buckets (twice the gradients' bytes); with it, the gradients of a bucket share one."""
    got = run_child(__file__)
    assert got["grads"] == got["params"] == 12
    assert got["storages"] < got["grads"]  # 12 gradients in far fewer (bucket) storages
    assert got["storage_bytes"] == got["grad_bytes"]  # the buckets are exactly the gradients


def test_planner_prices_ddp_gradients_whole() -> None:
    """dp=2 without TP runs torch DDP: gradients whole at the peak, no bucket buffers on
    top; with dp=1 the gradients grow as the activations are freed (single pass)."""
    profile = parse_model("gpt2").to_profile(seq_len=512)
    cluster = parse_cluster("2xa100-80gb")
    train = TrainConfig(global_batch=8, seq_len=512)
    ev = Evaluator(profile, cluster, train)
    ddp = Strategy(dp=2, tp=1, pp=1, micro_batch_size=4)
    memory, _ = ev.memory(ddp)
    params = sum(x.params for x in profile.layers)
    assert memory.grads_bytes == params * train.grad_bytes
    assert memory.other_bytes == cluster.accelerator.runtime_overhead_bytes
    assert not ev.single_pass(ddp)
    assert ev.single_pass(Strategy(dp=1, tp=1, pp=1, micro_batch_size=8))


if __name__ == "__main__":
    child_main(_bucket_storage)
