"""torch's AdamW on host tensors by size, tensor count, pinned memory and DTensor: whether the
calibration's host-optimizer benchmark (`profiler/microbench_host.py`, 2**25 parameters in 8
plain tensors) stands for an offloaded model's step (a 1.24B Llama: 146 pinned DTensor shards).

    python benchmarks/host_adamw_sizes.py [SCALE]     (SCALE < 1 shrinks every size)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def step_s_per_param(
    mesh: DeviceMesh, params: float, tensors: int, *, pin: bool, dtensor: bool, steps: int = 3
) -> float:
    """Median seconds per parameter of AdamW steps after the one that makes the states."""
    size = int(params // tensors)
    weights = []
    for _ in range(tensors):
        w, g = torch.ones(size), torch.full((size,), 1e-3)
        if pin:
            w, g = w.pin_memory(), g.pin_memory()
        if dtensor:
            w, g = distribute_tensor(w, mesh, [Shard(0)]), distribute_tensor(g, mesh, [Shard(0)])
        p = torch.nn.Parameter(w)
        p.grad = g
        weights.append(p)
    opt = torch.optim.AdamW(weights, lr=1e-4, weight_decay=0.0)  # as the executor's
    opt.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / (size * tensors)


def main() -> None:
    """Print ns per parameter for each case."""
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    pin = torch.cuda.is_available()  # pinning needs a CUDA driver
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cases = [
        (2**25, 8, False, False),  # the calibration's benchmark
        (2**28, 16, False, False),
        (2**28, 16, False, True),
        (2**28, 16, pin, False),
        (1.24e9, 146, False, False),  # a 1.24B Llama's shards
        (1.24e9, 146, pin, True),  # as FSDP2's CPUOffloadPolicy holds them
    ]
    for params, tensors, pinned, dtensor in cases:
        s = step_s_per_param(mesh, params * scale, tensors, pin=pinned, dtensor=dtensor)
        print(
            f"{params * scale:.3g} parameters in {tensors} tensors, pinned {pinned}, DTensor "
            f"{dtensor}: {s * 1e9:.3f} ns per parameter",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
