"""Train a Hugging Face Llama, built from a config file, on synthetic tokens under a plan.

    paraplan plan --model llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=176,vocab=512,seq=128 \\
        --cluster 2xcpu --global-batch 8 --seq-len 64 --precision fp32 -o p.json
    paraplan run p.json -- examples/train_llama.py --model examples/configs/llama-tiny.json

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
