"""Train a Hugging Face Llama, built from a config file, on synthetic tokens under a plan.

    paraplan plan --model examples/configs/llama-tiny.json --cluster 2xcpu --global-batch 8 \\
        --seq-len 256 --fix cp=2 -o p.json
    paraplan run p.json -- examples/train_llama.py --model examples/configs/llama-tiny.json

(context parallelism cp=2: each rank holds two of four chunks of every sequence, attention
runs as a ring; any other plan for this config runs the same way).

Options as examples/train_gpt2.py (--plan or $PARAPLAN_PLAN, --steps, --report, checkpoints).
"""

from __future__ import annotations

import gc
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never download weights

import torch
import torch.distributed as dist
from train_gpt2 import parse_args, run
from transformers import LlamaConfig, LlamaForCausalLM


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    torch.manual_seed(args.seed)
    config = LlamaConfig.from_json_file(args.model)
    config._attn_implementation = "sdpa"  # causal without a mask, as the executor runs blocks
    run(LlamaForCausalLM(config), args)
    gc.collect()  # then leave the group cleanly (avoids gloo's abort at exit)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
