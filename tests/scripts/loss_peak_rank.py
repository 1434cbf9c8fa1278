"""One rank of tests/test_loss_memory.py (under torchrun, 2 gloo ranks): the peak rise of the
executor's loss (`executor.compose.causal_lm_loss`), forward and backward, over the level
before the logits exist, on a rank's logits shard, plain and under torch's `loss_parallel`.
Writes {"plain": bytes, "parallel": bytes, "logits": bytes} as JSON to argv[1] (rank 0)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel

from paraplan.executor.compose import causal_lm_loss
from paraplan.profiler.host_memory import TensorPeakTracker

BATCH, SEQ, HIDDEN, VOCAB = 2, 512, 16, 4096  # logits shard: 2 x 512 x 2048 fp32 = 8 MiB


def _rise(parallel: bool, mesh: object) -> float:
    torch.manual_seed(dist.get_rank())
    h = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    w = torch.randn(HIDDEN, VOCAB // 2, requires_grad=True)  # the head's vocabulary shard
    labels = torch.randint(0, VOCAB if parallel else VOCAB // 2, (BATCH, SEQ))
    with TensorPeakTracker() as tracker:
        # the logits are not a leaf and nothing else holds them: freed once the loss has what
        # it keeps for backward, as in the executor's step
        if parallel:
            with loss_parallel():
                shard = DTensor.from_local(h @ w, mesh, [Shard(-1)])  # type: ignore[arg-type]
                loss = causal_lm_loss(shard, labels)
                del shard
                loss.backward()
        else:
            loss = causal_lm_loss(h @ w, labels)
            loss.backward()
    return tracker.result().rise_bytes


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {"plain": [], "parallel": []}
    for _ in range(2):  # the second of each counts (the first warms up dispatch caches)
        for kind in ("plain", "parallel"):
            out[kind].append(_rise(kind == "parallel", mesh))
    if dist.get_rank() == 0:
        logits = BATCH * SEQ * (VOCAB // 2) * 4
        result = {"plain": out["plain"][-1], "parallel": out["parallel"][-1], "logits": logits}
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
