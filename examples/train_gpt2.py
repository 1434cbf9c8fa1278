"""Train a Hugging Face GPT-2, built from a config file, on synthetic tokens under a plan.

    paraplan plan --model gpt:layers=4,hidden=64,heads=4,vocab=512,seq=128 --cluster 2xcpu \\
        --global-batch 8 --seq-len 64 --precision fp32 -o p.json
    paraplan run p.json -- examples/train_gpt2.py --model examples/configs/gpt2-tiny.json --steps 5
    # or: PARAPLAN_PLAN=p.json torchrun --nproc-per-node 2 examples/train_gpt2.py --model ...

The plan comes from --plan or the PARAPLAN_PLAN environment variable (set by `paraplan run`).
Every rank builds the same weights (same seed); `parallelize` refuses a plan made for another
model or world size before any communication. Rank 0 prints the run report.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never download weights

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel

from paraplan.executor import parallelize
from paraplan.executor.report import format_report
from paraplan.executor.training import RunOptions, train
from paraplan.planner.plan_io import load_plan


def parse_args(argv: list[str] | None, description: str = __doc__) -> argparse.Namespace:
    """Command-line options (shared with train_llama.py)."""
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face config JSON")
    parser.add_argument(
        "--plan",
        default=os.environ.get("PARAPLAN_PLAN"),
        help="plan JSON (default: $PARAPLAN_PLAN)",
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (default 2)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    parser.add_argument("--seed", type=int, default=0, help="weight and data seed")
    parser.add_argument("--report", help="write the run report JSON here")
    parser.add_argument("--checkpoint-dir", help="DCP checkpoints folder")
    parser.add_argument("--save-every", type=int, default=0, help="save every N steps")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="seconds a collective waits for a dead or stuck peer (default 300)",
    )
    args = parser.parse_args(argv)
    if not args.plan:
        parser.error("no plan: pass --plan p.json or launch with `paraplan run p.json -- ...`")
    return args


def run(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """Parallelize `model` with the plan, train, print and save the report on rank 0."""
    plan = load_plan(args.plan)
    pm = parallelize(model, plan, timeout_s=args.timeout_s)
    options = RunOptions(
        steps=args.steps,
        warmup_steps=args.warmup,
        lr=args.lr,
        data_seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every,
        resume=args.resume,
    )
    # `paraplan run` sets PARAPLAN_PROGRESS=1 when its stderr is a terminal and --no-progress
    # was not given: rank 0 then draws the training steps (erased when done).
    shown = dist.get_rank() == 0 and os.environ.get("PARAPLAN_PROGRESS") == "1"
    with tqdm(
        total=args.steps, desc="training", unit="step", disable=not shown, leave=False
    ) as bar:

        def on_step(step: int, loss: float) -> None:  # rank 0's loss is partial under a pipeline
            bar.update(step + 1 - bar.n)  # a resumed run starts past 0

        report = train(pm, options, on_step=on_step)
    if dist.get_rank() == 0:
        print(format_report(report), flush=True)
        if args.report:
            report.save(args.report)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config.from_json_file(args.model))
    run(model, args)
    gc.collect()  # then leave the group cleanly (avoids gloo's abort at exit)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
