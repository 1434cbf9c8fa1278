"""Meta-mode profiling of large Hugging Face models from their configs: wall time and peak RSS.

Target (issue 3): llama3-405b in under 60 s and under 4 GB peak RSS on the 2-core machine.
Each case runs in a fresh process (`paraplan profile --mode meta`), timed from outside; peak
RSS is the child's ru_maxrss. Prints a table, writes benchmarks/results/profile_meta.json,
exits 1 if a target is missed. Usage: python benchmarks/bench_profile_meta.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

# The child profiles through the CLI and reports its own peak RSS (ru_maxrss, KiB on Linux).
_CHILD = (
    "import resource, sys; from paraplan.cli import main; "
    "code = main(['profile', '--model', sys.argv[1], '--seq-len', sys.argv[2], '--mode', "
    "'meta', '--no-progress']); "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); "
    "sys.exit(code)"
)
CASES = [
    ("llama3-405b", 8192, 60.0, 4e9),
    ("llama3-70b", 8192, 60.0, 4e9),
    ("gpt2-xl", 1024, 60.0, 4e9),
    # MoE presets: their experts traced as balanced routing (profiler/moe.py)
    ("mixtral-8x7b", 4096, 60.0, 4e9),
    ("gpt-oss-120b", 4096, 60.0, 4e9),
    ("deepseek-v3", 4096, 60.0, 4e9),  # 3 dense blocks, then 58 MoE blocks of 256 experts
]


def main() -> int:
    rows = []
    for model, seq, target_s, target_rss in CASES:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, model, str(seq)],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - start
        rss = int(proc.stderr.strip().splitlines()[-1])
        head = proc.stdout.splitlines()[0] if proc.stdout else ""
        rows.append(
            {
                "model": model,
                "seq_len": seq,
                "wall_s": wall,
                "peak_rss_bytes": rss,
                "target_s": target_s,
                "target_rss_bytes": target_rss,
                "ok": wall < target_s and rss < target_rss,
                "summary": head,
            }
        )
    print(f"{'model':<14}{'seq':>6}{'wall s':>9}{'peak RSS GB':>13}  ok  summary")
    for r in rows:
        print(
            f"{r['model']:<14}{r['seq_len']:>6}{r['wall_s']:>9.1f}"
            f"{r['peak_rss_bytes'] / 1e9:>13.2f}  {'yes' if r['ok'] else 'NO '} "
            f"{r['summary']}"
        )
    out = Path(__file__).resolve().parent / "results" / "profile_meta.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "rows": rows}, indent=2))
    print(f"\nwritten {out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
