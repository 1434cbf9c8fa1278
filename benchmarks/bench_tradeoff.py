"""Checkpointing trade-off curves on profiled models (issue 4): time overhead against memory
budget for store-all, checkpoint_sequential with √L segments, full recomputation, and
paraplan's DP and ILP.

Two models are profiled in measure mode on the CPU (real per-layer times and bytes, random
weights, nothing downloaded): GPT-2 small (Hugging Face `GPT2LMHeadModel` from `GPT2Config`)
and a heterogeneous VGG-style CNN defined here. Each becomes a chain (`chain_from_profile`, one
micro-batch = the profiled batch), and `tradeoff_curves` evaluates every strategy at
`default_budgets` (from 1% above the smallest feasible peak up to the store-all peak).

Fails loudly (exit 1) if paraplan's DP or ILP is ever slower than a baseline that fits, or
infeasible where a baseline fits. Prints a table per model, writes
benchmarks/results/tradeoff.json.
Usage: python benchmarks/bench_tradeoff.py [--quick] [--budgets N] [--ilp-time-limit S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from paraplan.planner.solvers import (
    LayerChain,
    chain_from_profile,
    simulate,
    solve_checkpoint_dp,
)
from paraplan.planner.solvers.remat_ilp import DEFAULT_BACKEND
from paraplan.planner.solvers.tradeoff import (
    BASELINES,
    STRATEGIES,
    TradeoffCurve,
    baseline_schedule,
    default_budgets,
    tradeoff_curves,
)

TOL = 1e-9
"""Relative slack when comparing overheads (float rounding of sums of layer times)."""
MIB = 2**20

# (out channels, stride) per block, 3x3 convs; "M": 2x2 max-pool. Channels and resolution vary
# block to block: early blocks hold large activations and compute little per byte, late blocks
# the reverse (the heterogeneity Rotor exploits, Beaumont et al. 2019 §5).
CNN_BLOCKS: tuple[tuple[int, int] | str, ...] = (
    (32, 1),
    (32, 1),
    "M",
    (64, 1),
    (64, 1),
    "M",
    (128, 1),
    (128, 1),
    (128, 1),
    "M",
    (256, 1),
    (256, 1),
    (256, 2),
    (512, 1),
)


def hetero_cnn(classes: int = 100) -> Any:
    """A VGG-style CNN (Simonyan & Zisserman 2015) with batch norm: a stem, the blocks of
    `CNN_BLOCKS` in `features` (conv-BN-ReLU or max-pool), and a pooled linear head."""
    from torch import nn

    def conv(c_in: int, c_out: int, stride: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        )

    class HeteroCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = conv(3, 32, 1)
            blocks: list[nn.Module] = []
            c = 32
            for item in CNN_BLOCKS:
                if isinstance(item, str):
                    blocks.append(nn.MaxPool2d(2))
                else:
                    blocks.append(conv(c, item[0], item[1]))
                    c = item[0]
            self.features = nn.Sequential(*blocks)
            self.fc = nn.Linear(c, classes)

        def forward(self, x: Any) -> Any:  # (B, 3, H, W) -> (B, classes)
            return self.fc(self.features(self.stem(x)).mean(dim=(2, 3)))

    return HeteroCNN()


def profile_gpt2(batch: int, seq: int, repeats: int) -> Any:
    """GPT-2 small (124M parameters, random weights) profiled in measure mode, fp32 on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import paraplan
    from paraplan.profiler.hf import build_model, example_inputs, load_config

    torch.manual_seed(0)
    cfg = load_config({"model_type": "gpt2"})
    model = build_model(cfg, device="cpu", dtype=torch.float32)
    inputs = example_inputs(cfg, batch, seq, "cpu")
    return paraplan.profile(
        model, inputs, mode="measure", name="gpt2-small", warmup=1, repeats=repeats
    )


def profile_cnn(batch: int, image: int, repeats: int) -> Any:
    """`hetero_cnn` profiled in measure mode, fp32 on CPU, with a cross-entropy loss."""
    import torch

    import paraplan

    torch.manual_seed(0)
    model = hetero_cnn()
    x = torch.randn(batch, 3, image, image)  # (B, 3, H, W)
    y = torch.randint(0, 100, (batch,))
    return paraplan.profile(
        model,
        (x,),
        mode="measure",
        blocks="features",
        name="hetero-cnn",
        warmup=1,
        repeats=repeats,
        loss_fn=lambda out: torch.nn.functional.cross_entropy(out, y),
    )


def check(curves: tuple[TradeoffCurve, ...]) -> list[str]:
    """Where paraplan's DP or ILP is slower than, or infeasible next to, a fitting baseline."""
    by = {c.strategy: c.points for c in curves}
    problems = []
    for i, budget in enumerate(p.budget_bytes for p in by["store-all"]):
        fitting = {s: by[s][i].overhead for s in BASELINES if by[s][i].overhead is not None}
        if not fitting:
            continue
        best = min(fitting.values())
        for s in ("paraplan-dp", "paraplan-ilp"):
            mine = by[s][i].overhead
            if mine is None:
                problems.append(
                    f"{s} has no schedule at {budget / MIB:.1f} MiB where {sorted(fitting)} fit"
                )
            elif mine > best + TOL * (1 + abs(best)):
                problems.append(
                    f"{s} overhead {mine:.4%} at {budget / MIB:.1f} MiB is worse than "
                    f"the best fitting baseline's {best:.4%}"
                )
    return problems


def table(
    chain: LayerChain, curves: tuple[TradeoffCurve, ...], ref_s: float, top: float
) -> list[str]:
    """Markdown rows: budget, each strategy's overhead, paraplan's gain over the best baseline."""
    by = {c.strategy: c.points for c in curves}
    lines = [
        f"{chain.name}: {len(chain)} layers, store-all {ref_s * 1e3:.1f} ms, peak "
        f"{top / MIB:.0f} MiB",
        "| budget MiB | " + " | ".join(STRATEGIES) + " | gain (pp) |",
        "|---:|" + "---:|" * (len(STRATEGIES) + 1),
    ]
    for i, point in enumerate(by["store-all"]):
        cells = []
        for s in STRATEGIES:
            p = by[s][i]
            mark = "*" if p.status == "feasible" else ""
            cells.append("—" if p.overhead is None else f"{p.overhead:.1%}{mark}")
        base = [by[s][i].overhead for s in BASELINES if by[s][i].overhead is not None]
        ours = [
            by[s][i].overhead
            for s in ("paraplan-dp", "paraplan-ilp")
            if by[s][i].overhead is not None
        ]
        gain = f"{(min(base) - min(ours)) * 100:.1f}" if base and ours else "—"
        lines.append(f"| {point.budget_bytes / MIB:.0f} | " + " | ".join(cells) + f" | {gain} |")
    return lines


def run_model(label: str, profile: Any, batch: int, n: int, time_limit_s: float) -> dict[str, Any]:
    """Curves of one profiled model (a micro-batch is the profiled batch), table, checks."""
    chain = chain_from_profile(profile, micro_batch_size=batch)
    store = simulate(chain, baseline_schedule(chain, "store-all"))
    budgets = default_budgets(chain, n)
    start = time.perf_counter()
    curves = tradeoff_curves(chain, budgets, ilp_time_limit_s=time_limit_s)
    wall = time.perf_counter() - start
    lines = table(chain, curves, store.makespan_s, store.peak_bytes)
    print("\n" + "\n".join(lines))
    problems = check(curves)
    for p in problems:
        print(f"FAIL: {p}")
    return {
        "model": label,
        "chain": chain.name,
        "layers": len(chain),
        "store_all_makespan_s": store.makespan_s,
        "store_all_peak_bytes": store.peak_bytes,
        "min_peak_bytes": solve_checkpoint_dp(chain, 0.0).min_budget_bytes,
        "curves_wall_s": wall,
        "table": lines,
        "problems": problems,
        "curves": [asdict(c) for c in curves],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller inputs, 4 budgets, 5 s ILP limit"
    )
    parser.add_argument("--budgets", type=int, default=None, help="budgets per curve (8)")
    parser.add_argument("--ilp-time-limit", type=float, default=None, help="seconds (10)")
    args = parser.parse_args()
    quick = args.quick
    n = args.budgets or (4 if quick else 8)
    limit = args.ilp_time_limit or (5.0 if quick else 10.0)
    gpt2 = {"batch": 2, "seq": 128 if quick else 256, "repeats": 1 if quick else 3}
    cnn = {"batch": 8 if quick else 16, "image": 32 if quick else 64, "repeats": 1 if quick else 3}
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    results = []
    for label, fn, kw in (("gpt2-small", profile_gpt2, gpt2), ("hetero-cnn", profile_cnn, cnn)):
        start = time.perf_counter()
        prof = fn(**kw)
        prof_s = time.perf_counter() - start
        print(f"\nprofiled {label} {kw} in {prof_s:.1f} s")
        row = run_model(label, prof, kw["batch"], n, limit)
        row |= {"profile_args": kw, "profile_wall_s": prof_s}
        results.append(row)
    out = Path(__file__).parent / "results" / "tradeoff.json"
    out.parent.mkdir(exist_ok=True)
    result = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        },
        "quick": quick,
        "budgets": n,
        "ilp_time_limit_s": limit,
        "ilp_backend": DEFAULT_BACKEND,
        "models": results,
    }
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    ok = not any(r["problems"] for r in results)
    print(
        "\noverhead over store-all; * = not proven optimal (ILP time limit, or DP memory units "
        "too coarse); gain = best fitting baseline minus best of paraplan DP/ILP, in points"
    )
    print(f"wrote {out}; paraplan {'never worse than' if ok else 'WORSE THAN'} a fitting baseline")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
