"""Run under torchrun: auto_parallelize a tiny GPT-2 and write the plan and first loss."""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist

import paraplan
from paraplan.profiler.hf import build_model, load_config

CONFIG = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": 256,
    "n_positions": 64,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def main(out: str) -> None:
    torch.manual_seed(0)
    model = build_model(load_config(CONFIG), device="cpu")
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))  # (B, T)
    pm = paraplan.auto_parallelize(
        model, {"input_ids": ids[:2], "labels": ids[:2]}, global_batch=8, timeout_s=60
    )
    rows = ids.chunk(pm.plan.parallelism.dp)[pm.dp_rank]
    loss = pm.forward_backward(rows, rows)
    losses = [None] * dist.get_world_size()
    dist.all_gather_object(losses, None if loss is None else float(loss))
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump({"plan": pm.plan.to_dict(), "losses": losses}, fh)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
