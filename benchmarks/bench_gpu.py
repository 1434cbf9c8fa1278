"""Issue 12 on a GPU: `paraplan calibrate` on the device at hand, then single-device plans of a
1B-class Llama (no recompute, per-layer recompute, optimizer offload) trained under
`paraplan run`, each measured against what the catalog and the calibration predicted; then
`paraplan calibrate --from-run` on those runs and the plans priced again.

    python benchmarks/bench_gpu.py [--out bench-gpu.json] [--folder DIR] [--bundle B.tgz] [--quick]
    python benchmarks/bench_gpu.py --cpu     (a dry run of every step on a tiny Llama, no GPU)

Prints a table and writes everything as JSON (plans, reports and cluster files stay in the
folder). Step times are medians over the timed steps; peak memory is
torch.cuda.max_memory_allocated plus what lies outside torch's allocator (the run report's).
The memory headroom is raised so that the per-layer plan must recompute some blocks on a
device that would otherwise hold every activation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_calibration import report_figures  # benchmarks/ is this script's folder

from paraplan.api import model_profile
from paraplan.api import plan as plan_model
from paraplan.planner.hardware import accelerator_for_device_name
from paraplan.planner.model import ModelProfile
from paraplan.planner.plan_io import save_plan

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_llama.py"


@dataclass(frozen=True)
class Setup:
    """What one device kind trains: the config, its sequence and batch, the planner's memory
    headroom, the steps of each run and the strategies (name -> --fix pins)."""

    config: Path
    seq_len: int
    global_batch: int
    memory_headroom: float
    steps: int
    warmup: int
    strategies: dict[str, str]


GPU = Setup(
    config=ROOT / "examples" / "configs" / "llama-1b.json",
    seq_len=2048,
    global_batch=16,
    memory_headroom=0.6,  # ~56 GiB usable of an H200's 141: mbs 8 must recompute some blocks
    steps=10,
    warmup=3,
    strategies={
        "no recompute": "mbs=4,recompute=none,zero=0,offload=false",
        "per-layer recompute": "mbs=8,recompute=per_layer,zero=0,offload=false",
        "optimizer offload": "mbs=4,recompute=none,zero=2,offload=true",
    },
)
"""The acceptance's three single-device plans of a 1B-class Llama (Llama 3.2 1B's shapes)."""

CPU = Setup(
    config=ROOT / "examples" / "configs" / "llama-tiny.json",
    seq_len=256,
    global_batch=8,
    memory_headroom=0.1,
    steps=6,
    warmup=2,
    strategies={
        "no recompute": "mbs=4,recompute=none,zero=0,offload=false",
        "per-layer recompute": "mbs=8,recompute=per_layer,zero=0,offload=false",
        "full recompute": "mbs=4,recompute=full,zero=0,offload=false",
    },
)
"""A dry run of the same steps without a GPU (one CPU rank, a tiny Llama; a CPU has no
separate host memory to offload to)."""

RUN_TIMEOUT_S = 240.0
"""One training run at most: a hang must not take the whole (lent, timed) device session."""


def paraplan(*args: str, timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the paraplan CLI of this interpreter; a run over `timeout_s` fails (exit 124)."""
    cmd = [sys.executable, "-m", "paraplan", *args]
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
            cwd=tempfile.gettempdir(),
        )  # not the checkout: `-m paraplan` would import its folder, not the installed package
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout_s:.0f} s")


def cluster_spec(cpu: bool) -> tuple[str, str]:
    """(`1x<catalog name>`, the device's name) of the device at hand, asked in a child process:
    a CUDA context in this one would sit on the GPU through every run and count in their
    measured memory (what lies outside torch's allocator)."""
    if cpu:
        return "1xcpu", "cpu"
    ask = (
        "import torch; p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() "
        "else None; print(p.total_memory if p else 0, torch.cuda.get_device_name(0) if p else '')"
    )
    done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True)
    total, _, name = done.stdout.strip().partition(" ")
    if not name:
        raise SystemExit("bench_gpu: no CUDA device here; use --cpu for a dry run")
    acc = accelerator_for_device_name(name, memory_bytes=int(total))
    if acc is None:
        raise SystemExit(f"bench_gpu: {name!r} is not in the catalog")
    return f"1x{acc}", name


def plan_rows(
    setup: Setup, profile: ModelProfile, cluster: str, folder: Path, tag: str
) -> dict[str, dict]:
    """One plan per strategy on `cluster`, saved in `folder` as `<tag>-<n>.json`."""
    rows = {}
    for i, (name, pins) in enumerate(setup.strategies.items()):
        try:
            outcome = plan_model(
                profile,
                cluster,
                global_batch=setup.global_batch,
                memory_headroom=setup.memory_headroom,
                fix=pins,
                top_k=0,
            )
        except ValueError as err:
            rows[name] = {"error": str(err)}
            continue
        plan = outcome.plan
        file = folder / f"{tag}-{i}.json"
        save_plan(plan, file)
        rows[name] = {
            "plan": plan.short(),
            "plan_file": str(file),
            "predicted_step_time_s": plan.predicted.step_time_s,
            "predicted_memory_bytes": plan.predicted.memory_per_gpu_bytes,
        }
    return rows


def run_one(setup: Setup, plan_file: str, report: Path) -> dict:
    """Train under one plan with `paraplan run`; the run report's figures."""
    start = time.perf_counter()
    args = ["--model", str(setup.config), "--steps", str(setup.steps)]
    args += ["--warmup", str(setup.warmup), "--report", str(report)]
    done = paraplan("run", plan_file, "--no-progress", "--", str(SCRIPT), *args)
    if done.returncode != 0 or not report.is_file():
        return {"error": (done.stdout + done.stderr)[-3000:]}
    return report_figures(report) | {"wall_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    """Calibrate, plan (catalog and calibrated), run, refit, re-plan; print and save."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-gpu.json", help="JSON results")
    parser.add_argument("--folder", help="where plans, reports and cluster files go")
    parser.add_argument("--quick", action="store_true", help="calibrate --quick")
    parser.add_argument("--cpu", action="store_true", help="dry run without a GPU")
    parser.add_argument("--skip-calibrate", action="store_true", help="catalog plans only")
    parser.add_argument(
        "--bundle",
        help="also write the folder (plans, reports, cluster files, plots) as one .tar.gz: a "
        "device tool that returns few files returns it whole",
    )
    args = parser.parse_args(argv)
    setup = CPU if args.cpu else GPU
    folder = Path(args.folder or tempfile.mkdtemp(prefix="paraplan-bench-gpu-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    spec, device = cluster_spec(args.cpu)
    result: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cluster": spec,
        "device": device,
    }
    print(f"bench_gpu: {spec} ({device})", flush=True)

    cal = folder / "cal.yaml"
    tries = [["--quick"]] if args.quick else [[], ["--quick"]]  # --quick if a full one fails
    for extra in [] if args.skip_calibrate else tries:
        start = time.perf_counter()
        done = paraplan(
            "calibrate", "--cluster", spec, "-o", str(cal), "--no-progress", *extra,
            "--plot", str(folder / "plots"), timeout_s=240,
        )  # fmt: skip
        result["calibrate_s"] = time.perf_counter() - start
        result["calibrate_quick"] = bool(extra)
        print(done.stdout, done.stderr[-3000:], flush=True)
        if done.returncode == 0:
            break
        result.setdefault("calibrate_errors", []).append(done.stderr[-3000:])
    calibrated = cal.is_file()
    # traced once (on the meta device), priced on each cluster file
    profile = model_profile(str(setup.config), seq_len=setup.seq_len, precision="bf16")
    rows = {name: {"strategy": name} for name in setup.strategies}
    for name, got in plan_rows(setup, profile, spec, folder, "catalog").items():
        rows[name] |= {f"catalog_{k}": v for k, v in got.items()}
    if calibrated:
        for name, got in plan_rows(setup, profile, str(cal), folder, "calibrated").items():
            rows[name] |= got
    key = "plan_file" if calibrated else "catalog_plan_file"
    for i, row in enumerate(rows.values()):
        if key not in row:
            continue
        got = run_one(setup, row[key], folder / f"report-{i}.json")
        row |= got
        if "step_time_s" in got:
            pred = row.get("predicted_step_time_s") or row["catalog_predicted_step_time_s"]
            mem = row.get("predicted_memory_bytes") or row["catalog_predicted_memory_bytes"]
            row["step_time_rel_err"] = got["step_time_s"] / pred - 1
            row["memory_rel_err"] = got["peak_memory_bytes"] / mem - 1
            print(
                f"{row['strategy']:<22}measured {got['step_time_s']:.4f} s predicted "
                f"{pred:.4f} s ({row['step_time_rel_err']:+.1%}); memory "
                f"{row['memory_rel_err']:+.1%} (catalog: "
                f"{got['step_time_s'] / row['catalog_predicted_step_time_s'] - 1:+.1%})",
                flush=True,
            )
        else:
            print(f"{row['strategy']:<22}failed: {got['error'][-1500:]}", flush=True)
    reports = [r["report_file"] for r in rows.values() if "report_file" in r]
    if calibrated and reports:
        refit = folder / "refit.yaml"
        done = paraplan(
            "calibrate", "--from-run", *reports, "--cluster", str(cal), "-o", str(refit)
        )
        print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
        if done.returncode == 0:
            for name, got in plan_rows(setup, profile, str(refit), folder, "refit").items():
                if "predicted_step_time_s" in got:
                    rows[name]["refit_predicted_step_time_s"] = got["predicted_step_time_s"]
                    rows[name]["refit_predicted_memory_bytes"] = got["predicted_memory_bytes"]
    ran = [r for r in rows.values() if "step_time_s" in r]
    print(f"\n{'strategy':<22}{'measured s':>11}{'catalog':>9}{'calib.':>9}{'refit':>9}{'mem':>8}")
    for r in ran:
        cells = [
            f"{r['step_time_s'] / r[k] - 1:>+9.1%}" if k in r else f"{'-':>9}"
            for k in (
                "catalog_predicted_step_time_s",
                "predicted_step_time_s",
                "refit_predicted_step_time_s",
            )
        ]
        mem = f"{r['memory_rel_err']:>+8.1%}"
        print(f"{r['strategy']:<22}{r['step_time_s']:>11.4f}{''.join(cells)}{mem}")
    errs = [abs(r["step_time_rel_err"]) for r in ran]
    if errs:
        result["mean_abs_step_err"] = statistics.fmean(errs)
        result["within_10pct"] = sum(e <= 0.10 for e in errs)
    result["rows"] = list(rows.values())
    result["folder"] = str(folder)
    Path(args.out).resolve().write_text(json.dumps(result, indent=2) + "\n")
    if args.bundle:
        with tarfile.open(args.bundle, "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
    print(f"results written to {args.out} (plans, reports and cluster files in {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
