"""One rank of tests/test_partial_grads.py (torchrun, gloo): Partial gradients of replicated
DTensor parameters reduced once by `executor.partial_grads` equal DTensor's own reduction, and
an AdamW step after it equals one that lets DTensor reduce lazily."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from paraplan.executor.partial_grads import reduce_partial_grads


def params_and_grads(mesh: object) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    shapes = [(8,), (4, 3), (5,)]
    dtypes = [torch.float32, torch.float32, torch.float64]
    params = [
        torch.nn.Parameter(DTensor.from_local(torch.randn(s, dtype=d), mesh, [Replicate()]))
        for s, d in zip(shapes, dtypes, strict=True)
    ]
    rank = dist.get_rank()
    loss = 0.0
    for p in params:  # each rank sees its own slice of the "sequence": Partial(sum) grads
        x = torch.randn((2, *p.shape), dtype=p.dtype, generator=torch.Generator().manual_seed(rank))
        xs = DTensor.from_local(x, mesh, [Shard(0)])
        loss = loss + (xs * p).square().sum()
    loss.backward()
    return params


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    lazy = params_and_grads(mesh)
    placements = [str(p.grad.placements) for p in lazy]
    reference = [p.grad.full_tensor() for p in lazy]
    torch.optim.AdamW(lazy, lr=0.1).step()  # DTensor reduces as AdamW reads each gradient

    eager = params_and_grads(mesh)
    issued = reduce_partial_grads(eager)
    reduced = [p.grad.to_local().clone() for p in eager]
    after = [str(p.grad.placements) for p in eager]
    torch.optim.AdamW(eager, lr=0.1).step()
    if dist.get_rank() == 0:
        result = {
            "placements_before": placements,
            "placements_after": after,
            "collectives": issued,
            "grads_equal": all(torch.equal(a, b) for a, b in zip(reference, reduced, strict=True)),
            "params_equal": all(
                torch.equal(a.to_local(), b.to_local()) for a, b in zip(lazy, eager, strict=True)
            ),
            "again": reduce_partial_grads(eager),
        }
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
