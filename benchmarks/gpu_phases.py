"""Where one plan's step goes on the device: zero_grad, forward+backward (all micro-batches)
and the optimizer step, each timed between device synchronizations, then (with --profile) one
step under torch.profiler, its operators by host and by device time.

    torchrun --nproc-per-node 1 benchmarks/gpu_phases.py PLAN.json CONFIG.json [--profile]

A Llama config (the executor's `examples/train_llama.py` model, random weights). Used on an
H200 on 2026-11-26 to split the optimizer-offload plan's step (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from paraplan.executor import parallelize
from paraplan.executor.data import synthetic_tokens
from paraplan.executor.optim import Optimizers
from paraplan.planner.plan_io import load_plan


def main() -> None:
    """Time the phases of six steps (the first warms up) and profile one more."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plan")
    parser.add_argument("config")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    plan = load_plan(args.plan)
    config = LlamaConfig.from_json_file(args.config)
    config._attn_implementation = "sdpa"  # as examples/train_llama.py
    pm = parallelize(LlamaForCausalLM(config), plan)
    opts = Optimizers(pm, lr=1e-4)

    def sync() -> float:
        if pm.device.type == "cuda":
            torch.cuda.synchronize(pm.device)
        return time.perf_counter()

    t = plan.train
    x = y = torch.empty(0)
    for step in range(args.steps):
        x, y = synthetic_tokens(t.global_batch, t.seq_len, plan.model.vocab, seed=0, step=step)
        x, y = pm.local_batch(x), pm.local_batch(y)
        t0 = sync()
        opts.zero_grad()
        t1 = sync()
        pm.forward_backward(x, y)
        t2 = sync()
        opts.step()
        t3 = sync()
        print(
            f"step {step}: zero_grad {t1 - t0:.4f} fwd+bwd {t2 - t1:.4f} opt.step {t3 - t2:.4f}"
            f" total {t3 - t0:.4f}",
            flush=True,
        )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if pm.device.type == "cuda":
            acts.append(ProfilerActivity.CUDA)
        with profile(activities=acts) as prof:
            opts.zero_grad()
            pm.forward_backward(x, y)
            opts.step()
            sync()
        table = prof.key_averages()
        print(table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        if pm.device.type == "cuda":
            print(table.table(sort_by="self_device_time_total", row_limit=25))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
