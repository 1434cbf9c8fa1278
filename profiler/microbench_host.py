"""The host's optimizer step, measured for optimizer offload on a GPU machine.

With `offload_optimizer` the executor keeps the fp32 parameters, gradients and AdamW states in
host memory (FSDP2's `CPUOffloadPolicy`) and torch's AdamW updates them on the CPU: off CUDA
it runs the single-tensor loop (no foreach kernels), memory-bound over the states. How fast
depends on the host (its memory bandwidth, the threads each rank gets), which no catalog
figure knows: for a 1.24B-parameter Llama on the first H200 machine the assumed 20 GB/s priced
the update at 2.0 s, this benchmark at 1.0 s, and the whole offload (update and copies)
measured 1.5-1.8 s per step (2026-11-26).
"""

from __future__ import annotations

import statistics
import time

import torch

HOST_ADAMW_PARAMS = 2**25
"""Parameters the benchmark updates (128 MiB per fp32 state, 512 MiB in all): far beyond the
host's caches, as a model's shard is."""
HOST_ADAMW_TENSORS = 8
"""Tensors they are split into (a model's dozens of weights of a few to hundreds of MiB)."""
HOST_ADAMW_STEPS = 3
"""Timed steps (after one that creates the states); the median is kept."""


def host_adamw_s_per_param(threads: int, params: int = HOST_ADAMW_PARAMS) -> float:
    """Seconds per parameter of torch's AdamW step on fp32 host tensors with `threads` CPU
    threads (a training rank's share: torchrun gives each of several ranks one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        size = max(1, params // HOST_ADAMW_TENSORS)
        weights = [torch.nn.Parameter(torch.ones(size)) for _ in range(HOST_ADAMW_TENSORS)]
        for w in weights:
            w.grad = torch.full_like(w, 1e-3)
        opt = torch.optim.AdamW(weights, lr=1e-4, weight_decay=0.0)
        opt.step()  # creates the states
        times = []
        for _ in range(HOST_ADAMW_STEPS):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) / (size * HOST_ADAMW_TENSORS)
    finally:
        torch.set_num_threads(before)
