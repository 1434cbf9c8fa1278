"""One rank of tests/test_autocast_collectives.py (under torchrun, 2 gloo ranks): the
collectives and concatenations of one executor training step of the tiny GPT-2 under TP 2
with sequence parallelism in bf16 (autocast over fp32 weights), each as (op, dtype, bytes:
a collective's unsharded, a concatenation's output), in the order they were issued, recorded
with a dispatch mode on rank 0. Writes them as JSON to argv[1]."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from paraplan.executor import Optimizers, parallelize
from paraplan.executor.training import train_step
from tests.executor_plans import SEQ_LEN, make_plan, tiny_model

MBS = 2
COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
"""The functional collectives TP issues (not `wait_tensor` nor `_wrap_tensor_autograd`)."""


class _Collectives(TorchDispatchMode):
    """Records each functional collective's op, dtype and unsharded bytes."""

    def __init__(self, world: int) -> None:
        super().__init__()
        self.world = world
        self.seen: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        if func is torch.ops.aten.cat.default:  # the layout copies around SP collectives
            out = func(*args, **(kwargs or {}))
            self.seen.append(("cat", str(out.dtype).removeprefix("torch."), out.nbytes))
            return out
        if "_c10d_functional" in str(func) and name in COLLECTIVES:
            t = args[0]
            nbytes = t.numel() * t.element_size()
            if name == "all_gather_into_tensor":
                nbytes *= self.world  # the input is one rank's shard
            self.seen.append((name, str(t.dtype).removeprefix("torch."), nbytes))
        return func(*args, **(kwargs or {}))


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    plan = make_plan(tp=2, sp=True, precision="bf16", mbs=MBS)
    pm = parallelize(tiny_model("gpt2"), plan)
    opts = Optimizers(pm, lr=1e-3)
    x = torch.randint(0, 512, (MBS, SEQ_LEN))
    train_step(pm, opts, x, x)  # warm-up
    mode = _Collectives(dist.get_world_size())
    with mode:
        train_step(pm, opts, x, x)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(mode.seen, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
