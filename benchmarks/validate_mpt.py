"""The cost model against MosaicML's MPT throughput tables: a second, independent set of
published runs, held out whole (no constant of paraplan was fitted on any of its rows).

Source: llm-foundry, scripts/train/benchmarking/README.md ("MPT Training Benchmarks"), the
tables "H100 80GB BF16 (Large Scale, >= 128 GPUs)" (added 2024-01-06, PR #838), "H100 80GB
BF16" and "H100 80GB FP8" (2023-10-19, PR #543), "A100 80GB/40GB with 1600 Gbps node-node
interconnect (RoCE)" (2023, torch 1.13-2.0); read at mosaicml/llm-foundry commit 495218376
(2024-04-22, the file's last change). Every row is transcribed into
benchmarks/llmfoundry_mpt_runs.csv as published (its columns: the table, model, sequence,
GPUs, MFU, micro-batch, accumulation, global batch, tokens/s, precision, FSDP mixed
precision, sharding, activation checkpointing, CPU offload, parameter count).

What the runs are, from the same repository at those dates (submit_benchmarks.py,
yamls/pretrain/mpt-*.yaml, Composer's FSDP helpers):
- MPT models: GPT-style blocks (LayerNorm, GELU MLP of 4x, biases, learned positions, tied
  embeddings, vocabulary 50368), d_model/n_layers/n_heads per size below; paraplan's count
  of their parameters equals the table's NumParams column on every row (tests check it);
- Composer's FSDP (torch FSDP1), one unit per block, sharded over every GPU
  (`FULL_SHARD`: ZeRO-3; `SHARD_GRAD_OP`: ZeRO-2), `limit_all_gathers`; activation
  checkpointing, where on, of every block (full recompute); decoupled AdamW;
- mixed precision `DEFAULT` (Composer: parameters gathered in bf16, gradients reduced in
  fp32) under `amp_bf16`, or `PURE` (gathered and reduced in bf16) under `bf16`;
- the loss flash-attn's fused cross-entropy (llmfoundry/models/mpt/modeling_mpt.py, `loss_fn`
  default `fused_crossentropy`);
- eager PyTorch (one kernel per operator) and MPT's `attn_impl: triton`, the Triton
  FlashAttention of Dao's flash_attn_triton.py, which its header says runs forward faster
  and backward slower than the CUDA kernel. paraplan prices attention at its SDPA
  (FlashAttention-2) rate: it has no rate of its own for that kernel.

Each row is priced pinned (dp = GPUs, tp = pp = 1, the row's ZeRO stage, micro-batch and
recompute), compared with its step time (the global batch in tokens over the published
tokens/s), and its priced peak memory checked against its GPU's: the run fitted.

    python benchmarks/validate_mpt.py [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import Precision, Runtime, TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.layout import StageSplit
from paraplan.planner.hardware import with_calibration
from paraplan.planner.model_spec import Attention, Norm, TransformerSpec
from paraplan.planner.pins import Pins
from paraplan.planner.search import Search
from paraplan.planner.strategy import Recompute, Schedule

DATA = Path(__file__).with_name("llmfoundry_mpt_runs.csv")
MPT_SIZES = {
    "125m": (768, 12, 12),
    "350m": (1024, 24, 16),
    "760m": (1536, 24, 12),
    "1b": (2048, 24, 16),
    "3b": (2560, 32, 20),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 48, 64),
    "70b": (8192, 80, 64),
}
"""Model name -> (d_model, n_layers, n_heads): llm-foundry scripts/train/yamls/pretrain/
mpt-{name}.yaml (expansion_ratio 4, vocab_size 50368 in every one)."""
MPT_VOCAB = 50368
GPUS = {"h100_80gb": "h100", "a100_80gb": "a100-80gb", "a100_40gb": "a100-40gb"}
"""The tables' GPU names -> paraplan's catalog (H100 SXM: MosaicML's H100 clusters)."""
LONG_TOKENS = 8192
"""Sequences over this are the tables' long-context rows, reported apart."""
ORDER_MARGIN = 0.10
"""Two rows are ordered when their published tokens/s per GPU differ by more than this."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MptRow:
    """One row of the tables, as published."""

    table: str
    model: str
    seq_len: int
    gpus: int
    gpu: str
    micro_batch: int
    global_batch: int
    tokens_per_s: float
    fp8: bool
    fp32_grads: bool
    zero_stage: int
    recompute: bool
    num_params: int

    @property
    def step_s(self) -> float:
        """Published seconds per optimizer step: the batch's tokens over the tokens/s."""
        return self.global_batch * self.seq_len / self.tokens_per_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus


@dataclass(frozen=True, kw_only=True, slots=True)
class MptResult:
    """A row priced."""

    row: MptRow
    predicted_step_s: float
    predicted_memory_bytes: float
    """Peak bytes on the fullest GPU, as the cost model prices the row's configuration."""
    capacity_bytes: float
    """The row's GPU's memory (the catalog's)."""

    @property
    def fits(self) -> bool:
        """Whether the cost model has the configuration, which ran, fit its GPU (no headroom)."""
        return self.predicted_memory_bytes <= self.capacity_bytes

    @property
    def error(self) -> float:
        """Predicted over published step time, minus one (positive: predicted too slow)."""
        return self.predicted_step_s / self.row.step_s - 1.0


def load_rows(path: Path = DATA) -> list[MptRow]:
    """Every row of the transcribed tables."""
    with path.open(newline="") as fh:
        return [
            MptRow(
                table=r["table"],
                model=r["model"],
                seq_len=int(r["seq_len"]),
                gpus=int(r["gpus"]),
                gpu=r["gpu"],
                micro_batch=int(r["micro_batch"]),
                global_batch=int(r["global_batch"]),
                tokens_per_s=float(r["tokens_per_s"]),
                fp8="fp8" in r["precision"],
                fp32_grads=r["mixed_precision"] == "DEFAULT",  # Composer: reduce_dtype fp32
                zero_stage={"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[r["sharding"]],
                recompute=r["activation_checkpointing"] == "True",
                num_params=int(r["num_params"]),
            )
            for r in csv.DictReader(fh)
        ]


def mpt_spec(row: MptRow) -> TransformerSpec:
    """The row's MPT model (GPT-style block, learned positions up to its sequence)."""
    d, layers, heads = MPT_SIZES[row.model]
    return TransformerSpec(
        name=f"mpt-{row.model}",
        layers=layers,
        hidden=d,
        heads=heads,
        vocab=MPT_VOCAB,
        seq=row.seq_len,
        tied_embeddings=True,
        learned_pos=True,
        bias=True,
        norm=Norm.LAYERNORM,
        attention=Attention.FLASH,
    )


def runtime_of(row: MptRow) -> Runtime:
    """Eager PyTorch under FSDP; gradients reduced in fp32 under Composer's `DEFAULT` mixed
    precision; the loss flash-attn's fused cross-entropy (llm-foundry's MPT `loss_fn`
    default, `fused_crossentropy`: a Triton kernel over the logits, no fp32 copies of them
    beside; paraplan's `torch_loss=False`)."""
    return Runtime(fp32_grads=row.fp32_grads, torch_loss=False)


def price(row: MptRow) -> MptResult:
    """The cost model's step time for the row, pinned to its configuration."""
    profile = mpt_spec(row).to_profile(seq_len=row.seq_len)
    cluster = parse_cluster(f"{row.gpus}x{GPUS[row.gpu]}")
    capacity = float(cluster.accelerator.memory_bytes)
    roomy = with_calibration(cluster.accelerator, {"memory_bytes": 2**60})  # priced whatever fits
    cluster = dataclasses.replace(cluster, accelerator=roomy)
    train = TrainConfig(
        global_batch=row.global_batch,
        seq_len=row.seq_len,
        precision=Precision.FP8 if row.fp8 else Precision.BF16,
        runtime=runtime_of(row),
        memory_headroom=0.0,
    )
    ev = Evaluator(profile, cluster, train, StageSplit.BALANCED)
    pins = Pins(
        dp=row.gpus,
        tp=1,
        pp=1,
        cp=1,
        ep=1,
        zero_stage=row.zero_stage,
        micro_batch_size=row.micro_batch,
        schedule=Schedule.NONE,
        recompute=Recompute.FULL if row.recompute else Recompute.NONE,
        sequence_parallel=False,
        offload_optimizer=False,
    )
    result = Search(ev, pins).run(top_k=0)
    best = result.best or result.min_memory
    if best is None:
        raise ValueError(f"{row}: nothing valid under the row's pins")
    return MptResult(
        row=row,
        predicted_step_s=best.step_time_s,
        predicted_memory_bytes=best.memory.total_bytes,
        capacity_bytes=capacity,
    )


def group_of(r: MptResult) -> str:
    """The row's reporting group: fp8, long context (over `LONG_TOKENS`) or bf16."""
    if r.row.fp8:
        return "fp8"
    return "bf16 long" if r.row.seq_len > LONG_TOKENS else "bf16"


def order_pairs(results: list[MptResult]) -> tuple[int, int]:
    """(pairs ordered alike, pairs compared): rows of one table and model whose published
    tokens/s per GPU differ by more than `ORDER_MARGIN`, and whether the predicted ones
    order them the same way."""
    same = total = 0
    for i, a in enumerate(results):
        for b in results[i + 1 :]:
            if (a.row.table, a.row.model) != (b.row.table, b.row.model):
                continue
            pa, pb = a.row.tokens_per_s_per_gpu, b.row.tokens_per_s_per_gpu
            if max(pa, pb) <= (1 + ORDER_MARGIN) * min(pa, pb):
                continue
            qa = a.row.global_batch * a.row.seq_len / a.predicted_step_s / a.row.gpus
            qb = b.row.global_batch * b.row.seq_len / b.predicted_step_s / b.row.gpus
            total += 1
            same += (pa > pb) == (qa > qb)
    return same, total


def summary(results: list[MptResult]) -> dict[str, float]:
    """Mean and max |error|, mean error, rows within 10% and 20%."""
    errs = [r.error for r in results]
    return {
        "rows": len(errs),
        "mean_abs_error": statistics.fmean(abs(e) for e in errs),
        "max_abs_error": max(abs(e) for e in errs),
        "mean_error": statistics.fmean(errs),
        "within_10pct": sum(abs(e) <= 0.10 for e in errs),
        "within_20pct": sum(abs(e) <= 0.20 for e in errs),
    }


def run(path: Path = DATA) -> list[MptResult]:
    """Every row priced."""
    return [price(row) for row in load_rows(path)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the rows and summaries here")
    parser.add_argument("--rows", action="store_true", help="print every row")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run()
    if args.rows:
        print(f"{'gpu':<10}{'model':>6}{'seq':>7}{'gpus':>5} zero rc   published  predicted  error")
        for r in results:
            w = r.row
            print(
                f"{w.gpu:<10}{w.model:>6}{w.seq_len:>7}{w.gpus:>5} {w.zero_stage:>4} "
                f"{'full' if w.recompute else 'none':<4} {w.step_s:>9.3f} "
                f"{r.predicted_step_s:>10.3f} {r.error:+6.1%}"
            )
    groups: dict[str, list[MptResult]] = {}
    for r in results:
        groups.setdefault(f"{group_of(r)} {r.row.gpu}", []).append(r)
        groups.setdefault(group_of(r), []).append(r)
    head = f"{'group':<24}{'rows':>5}{'mean |err|':>11}{'max |err|':>10}{'mean err':>10}"
    print(f"{head}{'<=10%':>7}")
    table = {}
    for name in sorted(groups):
        s = summary(groups[name])
        table[name] = s
        print(
            f"{name:<24}{s['rows']:>5}{s['mean_abs_error']:>11.1%}{s['max_abs_error']:>10.1%}"
            f"{s['mean_error']:>+10.1%}{s['within_10pct']:>7}"
        )
    same, total = order_pairs([r for r in results if not r.row.fp8])
    print(f"bf16 pairs ordered as published (per-GPU throughput apart by >10%): {same}/{total}")
    refused = [r for r in results if not r.fits]
    ratios = sorted(r.predicted_memory_bytes / r.capacity_bytes for r in results)
    quartiles = ", ".join(f"{q:.2f}" for q in statistics.quantiles(ratios, n=4))
    print(
        f"configurations that ran but are priced over their GPU's memory: {len(refused)}/"
        f"{len(results)} (priced peak over the GPU's memory: quartiles {quartiles}, "
        f"max {ratios[-1]:.2f})"
    )
    for r in refused:
        w = r.row
        print(
            f"  {w.gpu} {w.model} seq {w.seq_len} on {w.gpus}, micro-batch {w.micro_batch}: "
            f"{r.predicted_memory_bytes / 2**30:.1f} GiB of {r.capacity_bytes / 2**30:.0f}"
        )
    print(f"({time.perf_counter() - start:.1f} s)")
    if args.json:
        rows = [
            dataclasses.asdict(r.row)
            | {
                "predicted_step_s": r.predicted_step_s,
                "predicted_memory_bytes": r.predicted_memory_bytes,
                "capacity_bytes": r.capacity_bytes,
            }
            for r in results
        ]
        payload = {"summary": table, "pairs": [same, total], "rows": rows}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
