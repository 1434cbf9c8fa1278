"""Train a tiny Hugging Face Mixtral (mixture of experts), built from a config file, on
synthetic tokens under a plan; experts split over the plan's ep ranks (all-to-all dispatch).

    paraplan plan --model examples/configs/mixtral-tiny.json --cluster 2xcpu --global-batch 8 \\
        --seq-len 256 --fix ep=2 -o p.json
    paraplan run p.json -- examples/train_mixtral.py --model examples/configs/mixtral-tiny.json

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
from transformers import MixtralConfig, MixtralForCausalLM


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    torch.manual_seed(args.seed)
    config = MixtralConfig.from_json_file(args.model)
    config._attn_implementation = "sdpa"  # causal without a mask, as the executor runs blocks
    run(MixtralForCausalLM(config), args)
    gc.collect()  # then leave the group cleanly (avoids gloo's abort at exit)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
