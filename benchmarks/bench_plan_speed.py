"""Planning speed: wall time of `paraplan plan` end to end (process start included).

Targets (issue 16): every analytic-spec case under 1 s (gpt3-175b on 1024xa100-80gb, global
batch 1536, seq 2048; the 1T GPT of Narayanan et al. 2021 Table 1 on 3072 A100s; llama3-405b on
16384xh100 with `--model-source spec`), and traced presets at most 2 s more (llama3-405b and
llama3-8b traced from their Hugging Face configs on the meta device); `paraplan plan --help`
< 0.5 s. Prints a table, writes
benchmarks/results/plan_speed.json, exits 1 if a target is missed.
Usage: python benchmarks/bench_plan_speed.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ("help", ["plan", "--help"], 0.5),
    (
        "gpt3-175b on 1024xa100-80gb",
        [
            "plan",
            "--model",
            "gpt3-175b",
            "--cluster",
            "1024xa100-80gb",
            "--global-batch",
            "1536",
            "--seq-len",
            "2048",
            "--json",
        ],
        1.0,
    ),
    (
        "llama3-405b on 16384xh100",
        [
            "plan",
            "--model",
            "llama3-405b",
            "--cluster",
            "16384xh100",
            "--global-batch-tokens",
            "16M",
            "--seq-len",
            "8192",
            "--json",
        ],
        3.0,
    ),
    (
        "llama3-8b on 8xh100 (traced)",
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "8xh100",
            "--global-batch",
            "256",
            "--seq-len",
            "8192",
            "--json",
        ],
        3.0,
    ),
    (
        "1T GPT on 3072xa100-80gb (spec)",
        [
            "plan",
            "--model",
            "gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048",
            "--cluster",
            "3072xa100-80gb",
            "--global-batch",
            "3072",
            "--seq-len",
            "2048",
            "--json",
        ],
        1.0,
    ),
    (
        "llama3-405b analytic spec",
        [
            "plan",
            "--model",
            "llama3-405b",
            "--model-source",
            "spec",
            "--cluster",
            "16384xh100",
            "--global-batch-tokens",
            "16M",
            "--seq-len",
            "8192",
            "--json",
        ],
        1.0,
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, argv, target_s in CASES:
        times, plan = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "paraplan.cli", *argv],
                capture_output=True,
                text=True,
                check=True,
            )
            times.append(time.perf_counter() - start)
            if "--json" in argv:
                plan = json.loads(proc.stdout)
        median = statistics.median(times)
        rows.append(
            {
                "case": name,
                "median_s": median,
                "min_s": min(times),
                "target_s": target_s,
                "ok": median < target_s,
                "plan": None
                if plan is None
                else {
                    "parallelism": plan["parallelism"],
                    "schedule": plan["schedule"],
                    "micro_batch_size": plan["micro_batch_size"],
                    "step_time_s": plan["predicted"]["step_time_s"],
                    "mfu": plan["predicted"]["mfu"],
                },
            }
        )
    print(f"{'case':<32}{'median s':>10}{'min s':>9}{'target s':>10}  ok  plan")
    for r in rows:
        p = r["plan"]
        desc = (
            ""
            if p is None
            else (
                f"dp={p['parallelism']['dp']} tp={p['parallelism']['tp']} "
                f"pp={p['parallelism']['pp']}"
                f" cp={p['parallelism']['cp']} zero={p['parallelism']['zero_stage']} "
                f"{p['schedule']} mbs={p['micro_batch_size']} MFU {p['mfu']:.1%}"
            )
        )
        print(
            f"{r['case']:<32}{r['median_s']:>10.3f}{r['min_s']:>9.3f}{r['target_s']:>10.1f}"
            f"  {'yes' if r['ok'] else 'NO '} {desc}"
        )
    out = Path(__file__).resolve().parent / "results" / "plan_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "python": platform.python_version(),
                "repeats": args.repeats,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"\nwritten {out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
