"""`paraplan calibrate`: measure the devices at hand and write a cluster file whose calibration
`paraplan plan --cluster FILE` reads; or, with `--from-run`, refit a calibration from run
reports (measured step time and peak memory against the plan's predictions).

    paraplan calibrate --cluster 2xcpu -o cal.yaml [--quick] [--plot DIR]
    paraplan calibrate --from-run r1.json r2.json --cluster cal.yaml -o cal2.yaml

Exit status: 0 on success; 2 on bad input (an unknown cluster, reports that are not run
reports, a cluster file without a calibration for --from-run).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import EXIT_FAILED, EXIT_OK, add_no_progress_arg, format_bytes, progress_bar

if TYPE_CHECKING:
    from ..planner.calibration import Calibration
    from ..planner.cluster import Cluster


def add_parser(subparsers: Any) -> None:
    """Add the `calibrate` command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "calibrate",
        help="measure this machine (GEMMs, attention, bandwidth, dispatch, collectives)",
        description="Run microbenchmarks on the local devices (one rank per device, as in "
        "training), fit the cost model's kernel curves and link figures, and write a cluster "
        "file with a `calibration` section; --from-run refits one from run reports.",
    )
    p.add_argument(
        "--cluster",
        required=True,
        metavar="SPEC",
        help="the cluster to calibrate (a preset such as 2xcpu, or a cluster file; with "
        "--from-run, the calibrated cluster file to refit)",
    )
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="cluster file to write")
    p.add_argument("--quick", action="store_true", help="a coarser grid (under 30 s on a CPU)")
    p.add_argument(
        "--dtypes",
        metavar="LIST",
        help="dtypes to measure, e.g. fp32,bf16 (default: every one the device runs)",
    )
    p.add_argument("--plot", metavar="DIR", help="draw measured points against the fitted curves")
    p.add_argument(
        "--from-run",
        nargs="+",
        metavar="REPORT",
        help="run report JSON files (examples/train_gpt2.py --report) to refit on",
    )
    add_no_progress_arg(p)
    p.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    """Run `paraplan calibrate` on parsed arguments; prints, returns the exit status."""
    from ..planner.cluster import parse_cluster, save_cluster_file

    out = Path(args.output)
    if out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise ValueError(f"--output {args.output!r}: use a .yaml, .yml or .json file name")
    cluster = parse_cluster(args.cluster)
    if args.from_run:
        calibrated = _refit(cluster, args.from_run)
    else:
        from ..profiler.microbench_run import CalibrationRankError

        try:
            calibrated = _measure(cluster, args)
        except CalibrationRankError as err:
            print(f"paraplan: error: {err} (twice); nothing written", file=sys.stderr)
            return EXIT_FAILED
    save_cluster_file(calibrated, out)
    print(format_calibration(calibrated))
    if args.plot:
        for path in plot_calibration(_calibration_of(calibrated), Path(args.plot)):
            print(f"figure written to {path}")
    print(f"\ncluster file written to {out}; plan with --cluster {out}")
    return EXIT_OK


def _measure(cluster: Cluster, args: argparse.Namespace) -> Cluster:
    import dataclasses

    from ..planner.hardware import get_accelerator, with_calibration
    from ..profiler.microbench_machine import machine_load
    from ..profiler.microbench_run import calibrate

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    warning = busy_machine_warning(machine_load(), os.cpu_count() or 1)
    if warning:
        print(f"paraplan: warning: {warning}", file=sys.stderr)
    with progress_bar(args, desc="calibrating", total=1, unit="step") as bar:

        def progress(done: int, total: int, label: str) -> None:
            bar.total = total
            bar.set_postfix_str(label, refresh=False)
            bar.update(done - bar.n)

        calibration = calibrate(cluster, quick=args.quick, dtypes=dtypes, progress=progress)
    acc = with_calibration(get_accelerator(cluster.accelerator.name), calibration.figures)
    return dataclasses.replace(cluster, accelerator=acc, calibration=calibration)


BUSY_LOAD_PER_CPU = 0.5
"""Load average per CPU above which `calibrate` warns that the machine is busy."""


def busy_machine_warning(load: float, cpus: int) -> str | None:
    """What to tell a user calibrating on a busy machine (None when it is quiet enough)."""
    if load <= BUSY_LOAD_PER_CPU * cpus:
        return None
    return (
        f"the machine is busy (1-minute load {load:.1f} on {cpus} CPUs): figures measured now "
        "are slower and less stable than on a quiet machine; calibrate when it is idle (the "
        "load is recorded in the file as load_average)"
    )


def _refit(cluster: Cluster, reports: list[str]) -> Cluster:
    import dataclasses

    from ..planner.calibration_refit import machine_note, refit, refit_errors, run_sample
    from ..planner.documents import Document, wrong_kind
    from ..planner.hardware import get_accelerator, with_calibration
    from ..planner.jsonio import read_json

    if cluster.calibration is None:
        raise ValueError(
            f"--cluster {cluster.name!r} has no measured calibration to refit; run paraplan "
            "calibrate --cluster <N>x<device> -o cal.yaml first and pass cal.yaml"
        )
    samples = []
    for path in reports:
        data = read_json(path, "run report", "pass the JSON that paraplan run's script writes")
        other = wrong_kind(data, Document.RUN_REPORT, path)
        if other is not None:
            raise ValueError(f"run report {path!r}: {other}")
        ran_on = data.get("cluster") if isinstance(data, dict) else None
        if isinstance(ran_on, str) and ran_on != cluster.name:
            print(
                f"paraplan: note: {path} ran on cluster {data.get('cluster')!r}, not "
                f"{cluster.name!r}",
                file=sys.stderr,
            )
        samples.append(run_sample(data, origin=f"run report {path!r}"))
    old = cluster.calibration
    new, scales = refit(old, samples, accelerator=cluster.accelerator.name)
    before, after = refit_errors(samples, scales)
    parted = sum(1 for s in samples if s.parts is not None)
    print(
        f"refit on {len(samples)} run reports: time scale {old.time_scale:.3f} -> "
        f"{new.time_scale:.3f}, communication x{new.comm_scale:.3f} (was "
        f"x{old.comm_scale:.3f}), optimizer x{new.optimizer_scale:.3f} (was "
        f"x{old.optimizer_scale:.3f}); mean |step time error| {before:.1%} -> {after:.1%} (the "
        "reports' predictions rescaled; re-plan to see the new figures)"
        + ("" if parted else "; the reports predate their parts: one scale for all")
    )
    note = machine_note(samples)
    if note:
        print(note)
    acc = with_calibration(get_accelerator(cluster.accelerator.name), new.figures)
    return dataclasses.replace(cluster, accelerator=acc, calibration=new)


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _calibration_of(cluster: Cluster) -> Calibration:
    """The cluster's calibration; a cluster without one is refused by name."""
    if cluster.calibration is None:
        raise ValueError(
            f"cluster {cluster.name!r} carries no measured calibration; run paraplan calibrate "
            "--cluster SPEC -o cal.yaml and pass cal.yaml"
        )
    return cluster.calibration


def format_calibration(cluster: Cluster) -> str:
    """The measured figures and the fit as a short table."""
    from ..planner.calibration_links import collective_model_s
    from ..planner.cost.calibrated import MMAP_THRESHOLD_BYTES

    cal = _calibration_of(cluster)
    acc = cluster.accelerator
    lines = [
        f"calibration of {cluster.name}: {cal.device_name} ({cal.device_kind}), torch "
        f"{cal.torch_version}, {cal.date}, {cal.world_size} ranks x {cal.threads_per_rank} "
        f"thread(s), load {cal.load_average:.1f} at the start; time scale "
        f"{cal.time_scale:.3f} ({cal.refit_runs} run reports)",
        "",
        f"{'dtype':<6}{'GEMM peak':>13}{'GEMM 64^3':>13}{'attention':>13}{'elementwise':>14}"
        f"{'per op':>11}{'per GEMM shape':>16}",
    ]
    for entry in cal.dtype_kernels:
        fit = entry.fit
        attn = max(fit.attention.fwd_flops_per_s) if fit.attention else math.nan
        lines.append(
            f"{entry.dtype:<6}{_si(fit.peak_gemm_flops_per_s(), 'FLOP/s'):>13}"
            f"{_si(fit.gemm.fwd_flops_per_s[0], 'FLOP/s'):>13}{_si(attn, 'FLOP/s'):>13}"
            f"{_si(fit.elementwise_bw_bytes_per_s, 'B/s'):>14}{fit.launch_s * 1e6:>8.1f} us"
            f"{format_bytes(fit.gemm_shape_bytes):>16}"
        )
    lines += [
        "",
        (
            f"links (fitted on {len(cal.collectives)} collectives): "
            if cal.collectives
            else "links (the catalog's: one rank measures no collective): "
        )
        + f"{_si(acc.intra_node_bw_bytes_per_s, 'B/s')}, latency "
        f"{acc.intra_node_latency_s * 1e6:.1f} us per step; runtime memory per rank "
        f"{format_bytes(acc.runtime_overhead_bytes)}",
    ]
    fault = max(entry.fit.page_fault_s_per_byte for entry in cal.dtype_kernels)
    if fault > 0:
        size = format_bytes(MMAP_THRESHOLD_BYTES)
        lines.append(
            f"fresh pages (outputs of {size} or more): {fault * 1e9:.2f} ns per byte to first "
            f"touch, {fault * MMAP_THRESHOLD_BYTES * 1e3:.1f} ms per {size} output"
        )
    region = max(cal.dtype_kernels, key=lambda e: e.fit.checkpoint_saved_tensor_s).fit
    if region.checkpoint_region_s or region.checkpoint_saved_tensor_s:
        lines.append(
            f"activation checkpoint, beyond the recomputed forward: "
            f"{region.checkpoint_region_s * 1e6:.0f} us per region + "
            f"{region.checkpoint_saved_tensor_s * 1e6:.1f} us per saved tensor"
        )
    if cal.tensor_parallel is not None:
        per_block = ", ".join(
            f"{'gated' if b.gated else 'plain'} MLP{' + SP' if b.sequence_parallel else ''} "
            f"{b.fwd_s * 1e3:.1f}/{b.bwd_s * 1e3:.1f} ms"
            for b in cal.tensor_parallel.blocks
        )
        lines.append(f"DTensor host per TP block (forward/backward): {per_block}")
        tp = cal.tensor_parallel
        lines.append(
            f"DTensor host of the vocabulary-parallel loss (forward/backward): "
            f"{tp.loss_fwd_s * 1e3:.1f}/{tp.loss_bwd_s * 1e3:.1f} ms"
        )
    if cal.world_size > 1:
        lines.append(
            f"FSDP2 host per unit {cal.fsdp_unit_host_s * 1e3:.2f} ms + "
            f"{cal.fsdp_tensor_host_s * 1e6:.0f} us per parameter tensor; AdamW per DTensor "
            f"parameter {cal.dtensor_adamw_tensor_s * 1e6:.0f} us"
        )
    if cal.sync_skew_s > 0:
        lines.append(
            f"each collective after host work waits {cal.sync_skew_s * 1e6:.0f} us more for the "
            "slower rank (sync skew)"
        )
    if cal.speed_spread > 0:
        lines.append(
            f"steadiness: a fixed host workload, timed at every progress point, took up to "
            f"{cal.speed_spread:.0%} longer in its slow tenth than in its fast tenth"
        )
    if cal.host_adamw_s_per_param > 0:
        lines.append(
            f"host AdamW (optimizer offload): {cal.host_adamw_s_per_param * 1e9:.2f} ns per "
            f"parameter, {cal.host_adamw_s_per_param * 1e9:.2f} s per billion"
        )
    kinds = sorted({p.kind for p in cal.collectives})
    own = cal.kind_link_figures()
    for kind in kinds:
        pts = [p for p in cal.collectives if p.kind == kind]
        bw, lat = own.get(kind, (acc.intra_node_bw_bytes_per_s, acc.intra_node_latency_s))
        errs = [collective_model_s(p, bw=bw, lat=lat) / p.seconds - 1 for p in pts]
        lines.append(
            f"  {kind:<15} {len(pts)} sizes, {_si(pts[0].nbytes, 'B')}..{_si(pts[-1].nbytes, 'B')}"
            f": {pts[0].seconds * 1e3:.3f}..{pts[-1].seconds * 1e3:.3f} ms, "
            f"{bw / 1e9:.2f} GB/s, latency {lat * 1e6:.0f} us, fit error median "
            f"{statistics.median(errs):+.0%}, max {max(errs, key=abs):+.0%}"
        )
    return "\n".join(lines)


def plot_calibration(cal: Calibration, folder: Path) -> list[Path]:
    """Measured points against the fitted curves: collectives (the link fit), GEMM rates by
    work (the grid, and the interpolation along the diagonal), attention."""
    from matplotlib.figure import Figure

    from ..planner.calibration_links import collective_model_s
    from ..planner.hardware import get_accelerator, with_calibration

    folder.mkdir(parents=True, exist_ok=True)
    acc = with_calibration(get_accelerator(cal.catalog_name() or "cpu"), cal.figures)
    fig = Figure(figsize=(13, 4), layout="constrained")
    ax_c, ax_g, ax_a = fig.subplots(1, 3)
    for kind in sorted({p.kind for p in cal.collectives}):
        pts = [p for p in cal.collectives if p.kind == kind]
        xs = [p.nbytes for p in pts]
        (line,) = ax_c.loglog(xs, [p.seconds for p in pts], "o", label=str(kind))
        bw, lat = cal.kind_link_figures().get(
            kind, (acc.intra_node_bw_bytes_per_s, acc.intra_node_latency_s)
        )
        fitted = [collective_model_s(p, bw=bw, lat=lat) for p in pts]
        ax_c.loglog(xs, fitted, "-", color=line.get_color())
    ax_c.set(xlabel="bytes", ylabel="seconds", title="collectives: measured (o), fitted (-)")
    if cal.collectives:
        ax_c.legend(fontsize=7)
    else:  # one rank: no link to measure
        ax_c.text(
            0.5, 0.5, "one rank: no collective measured", ha="center", transform=ax_c.transAxes
        )
    for entry in cal.dtype_kernels:
        g = entry.fit.gemm
        shapes = [(m, n, k) for m in g.m for n in g.n for k in g.k]
        work = [2.0 * m * n * k for m, n, k in shapes]
        (line,) = ax_g.loglog(work, g.fwd_flops_per_s, "o", ms=3, label=f"{entry.dtype} grid")
        kern = cal.kernels(entry.dtype)
        diag = [2 ** (i / 4) for i in range(24, 4 * 13)]
        ax_g.loglog(
            [2.0 * s**3 for s in diag],
            [2.0 * s**3 / kern.gemm_s(round(s), round(s), round(s)) for s in diag],
            "-",
            color=line.get_color(),
            label=f"{entry.dtype} fit (M=N=K)",
        )
        if entry.fit.attention is not None:
            a = entry.fit.attention
            n = len(a.dense_fwd_flops)
            for i, d in enumerate(a.head_dims):
                (al,) = ax_a.loglog(
                    a.dense_fwd_flops,
                    a.fwd_flops_per_s[i * n : (i + 1) * n],
                    "o-",
                    label=f"{entry.dtype} d={d}",
                )
                ax_a.loglog(
                    a.dense_fwd_flops,
                    a.bwd_flops_per_s[i * n : (i + 1) * n],
                    "s--",
                    color=al.get_color(),
                )
    ax_g.set(xlabel="GEMM FLOPs", ylabel="FLOP/s", title="GEMM forward rate")
    ax_g.legend(fontsize=7)
    ax_a.set(
        xlabel="dense forward FLOPs",
        ylabel="FLOP/s",
        title="causal SDPA: forward (o-), backward (s--)",
    )
    ax_a.legend(fontsize=6, ncol=2)
    fig.suptitle(f"calibration: {cal.device_name}, torch {cal.torch_version}, {cal.date}")
    path = folder / "calibration.png"
    fig.savefig(path, dpi=90)
    return [path]
