"""Calibration (issue 12): the file format (strict, round trip), the measured kernel model
against hand-computed times, the link fit against the 2-rank ring formula, the refit from run
reports, the device-kind warning, the run report's hint, and one real closed loop on 2 gloo
ranks (quick calibration, plan, train) with loose bounds."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.planner.calibration import (
    Calibration,
    CollectiveKind,
    CollectivePoint,
    DeviceKind,
    DtypeKernels,
    calibration_from_dict,
    recalibrate_hint,
)
from paraplan.planner.calibration_links import fit_kind_links, fit_links
from paraplan.planner.calibration_refit import RunSample, refit, run_sample
from paraplan.planner.cluster import cluster_from_dict, load_cluster_file, save_cluster_file
from paraplan.planner.cost.calibrated import AttentionCurve, CalibratedKernels, GemmGrid, KernelFit
from paraplan.planner.cost.comm import BUS_EFFICIENCY_INTRA, HALF_BANDWIDTH_BYTES_INTRA

ROOT = Path(__file__).resolve().parents[1]
SIZES = (64, 256, 1024)
PARAPLAN = (sys.executable, "-m", "paraplan")
QUICK_FP32 = ("--quick", "--dtypes", "fp32", "--no-progress")


def _rate(m: int, n: int, k: int) -> float:
    """A made-up rate that grows with every dimension (FLOP/s)."""
    return 1e9 * math.log2(m) * math.log2(n) * math.log2(k) / 8


def _fit(launch_s: float = 1e-5) -> KernelFit:
    grid = [(m, n, k) for m in SIZES for n in SIZES for k in SIZES]
    return KernelFit(
        launch_s=launch_s,
        elementwise_bw_bytes_per_s=5e9,
        gemm=GemmGrid(
            m=SIZES,
            n=SIZES,
            k=SIZES,
            fwd_flops_per_s=tuple(_rate(*s) for s in grid),
            bwd_flops_per_s=tuple(_rate(*s) / 2 for s in grid),
        ),
        attention=AttentionCurve(
            head_dims=(16, 64),
            dense_fwd_flops=(1e6, 1e8),
            fwd_flops_per_s=(5e8, 2e9, 1e9, 4e9),
            bwd_flops_per_s=(2.5e8, 1e9, 5e8, 2e9),
        ),
    )


def _calibration(device_kind: DeviceKind = DeviceKind.CPU, name: str = "AMD EPYC") -> Calibration:
    return Calibration(
        device_name=name,
        device_kind=device_kind,
        torch_version="2.13.0+cpu",
        date="2026-01-01",
        world_size=2,
        threads_per_rank=1,
        figures={"memory_bw_bytes_per_s": 5e9, "runtime_overhead_bytes": 300 * 2**20},
        dtype_kernels=(DtypeKernels(dtype="fp32", fit=_fit()),),
        collectives=(
            CollectivePoint(kind=CollectiveKind.ALL_REDUCE, ranks=2, nbytes=4096.0, seconds=1e-3),
        ),
    )


def _cluster_dict(cal: Calibration, accelerator: str = "cpu") -> dict:
    return {
        "accelerator": accelerator,
        "nodes": 1,
        "gpus_per_node": 2,
        "calibration": cal.to_dict(),
    }


# ---- file format ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_cluster_file_with_calibration_round_trips(tmp_path: Path, suffix: str) -> None:
    cluster = cluster_from_dict(_cluster_dict(_calibration()))
    path = tmp_path / f"cal{suffix}"
    save_cluster_file(cluster, path)
    again = load_cluster_file(path)
    assert again == cluster
    assert again.fingerprint() == cluster.fingerprint()
    assert again.accelerator.memory_bw_bytes_per_s == 5e9  # the figures reach the accelerator
    assert again.accelerator.sources["memory_bw_bytes_per_s"] == "calibration"


def test_dtensor_runtime_is_priced_beside_tp_only() -> None:
    """`Calibration.tp_runtime_bytes` adds to the memory of a plan with TP, not without; a
    file without the field (before 2026-11-26) reads it as not measured."""
    data = _calibration().to_dict()
    del data["tp_runtime_bytes"]
    assert calibration_from_dict(data).tp_runtime_bytes == 0.0
    import paraplan

    config = ROOT / "examples" / "configs" / "gpt2-tiny.json"
    profile = paraplan.model_profile(str(config), seq_len=64, precision="fp32")
    held = 7e6

    def memory(tp_runtime_bytes: float, pins: str) -> float:
        cal = dataclasses.replace(_calibration(), tp_runtime_bytes=tp_runtime_bytes)
        cluster = cluster_from_dict(_cluster_dict(cal))
        plan = paraplan.plan(
            profile, cluster, global_batch=8, precision="fp32", fix=pins, top_k=0
        ).plan
        return plan.predicted.memory_per_gpu_bytes

    tp, dp = "dp=1,tp=2,pp=1,mbs=8,recompute=none", "dp=2,tp=1,pp=1,zero=0,mbs=4,recompute=none"
    assert memory(held, tp) - memory(0.0, tp) == pytest.approx(held)
    assert memory(held, dp) == memory(0.0, dp)


def test_calibration_changes_the_fingerprint() -> None:
    a = cluster_from_dict(_cluster_dict(_calibration()))
    slower = dataclasses.replace(_calibration(), time_scale=2.0)
    assert cluster_from_dict(_cluster_dict(slower)).fingerprint() != a.fingerprint()


@pytest.mark.parametrize(
    "path",
    [(), ("dtype_kernels", 0), ("dtype_kernels", 0, "fit"), ("dtype_kernels", 0, "fit", "gemm")],
)
def test_unknown_keys_are_rejected_at_every_level(path: tuple) -> None:
    data = _calibration().to_dict()
    node = data
    for key in path:
        node = node[key]
    node["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        calibration_from_dict(data)


@pytest.mark.parametrize("key", ["device_name", "torch_version", "date", "dtype_kernels"])
def test_missing_keys_are_rejected(key: str) -> None:
    data = _calibration().to_dict()
    del data[key]
    with pytest.raises(ValueError, match=key):
        calibration_from_dict(data)


def test_bad_values_are_rejected() -> None:
    data = _calibration().to_dict()
    data["dtype_kernels"][0]["fit"]["gemm"]["fwd_flops_per_s"][3] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        calibration_from_dict(data)
    data = _calibration().to_dict()
    data["figures"]["warp_speed"] = 9
    with pytest.raises(ValueError, match="warp_speed"):
        calibration_from_dict(data)
    data = _calibration().to_dict()
    data["dtype_kernels"][0]["fit"]["gemm"]["m"] = [256, 64, 1024]
    with pytest.raises(ValueError, match="ascending"):
        calibration_from_dict(copy.deepcopy(data))


# ---- the kernel model -------------------------------------------------------------------------
def test_gemm_times_at_grid_points_are_the_measured_ones() -> None:
    kern = CalibratedKernels(_fit())
    for m, n, k in [(64, 64, 64), (256, 1024, 64), (1024, 1024, 1024)]:
        fwd, bwd = kern.gemm_train_s(m, n, k)
        assert fwd == pytest.approx(2 * m * n * k / _rate(m, n, k), rel=1e-9)
        assert bwd == pytest.approx(4 * m * n * k / (_rate(m, n, k) / 2), rel=1e-9)


def test_gemm_rate_between_points_is_log_interpolated_and_clamped_outside() -> None:
    kern = CalibratedKernels(_fit())
    # halfway in log2 between m=64 and m=256: the geometric mean of the two rates
    expect = math.sqrt(_rate(64, 256, 256) * _rate(256, 256, 256))
    assert 2 * 128 * 256 * 256 / kern.gemm_s(128, 256, 256) == pytest.approx(expect, rel=1e-9)
    # beyond the grid the edge's rate holds
    big = kern.gemm_s(8192, 1024, 1024)
    assert big == pytest.approx(2 * 8192 * 1024 * 1024 / _rate(1024, 1024, 1024), rel=1e-9)


def test_time_scale_and_dispatch() -> None:
    one, two = CalibratedKernels(_fit(launch_s=2e-5)), CalibratedKernels(_fit(2e-5), time_scale=2)
    assert two.launch_s == pytest.approx(4e-5)
    assert two.gemm_s(100, 200, 300) == pytest.approx(2 * one.gemm_s(100, 200, 300))
    assert one.elementwise_s(5e9) == pytest.approx(1.0)
    f, b = one.attention_s(1e7)  # halfway (log) between the two points: rates 2e9 and 1e9
    assert f == pytest.approx(1e7 / 2e9) and b == pytest.approx(1e7 / 1e9)
    assert one.attention_s(1e7, causal=False)[0] == pytest.approx(2 * f)
    # head sizes: 16-wide heads at half the rate; 32 halfway in log2 (rate x 2^-0.5);
    # beyond the measured sizes the edge holds
    assert one.attention_s(1e7, head_dim=16)[0] == pytest.approx(2 * f)
    assert one.attention_s(1e7, head_dim=32)[0] == pytest.approx(2**0.5 * f)
    assert one.attention_s(1e7, head_dim=256) == pytest.approx((f, b))
    assert one.attention_s(1e7, head_dim=8) == pytest.approx((2 * f, 2 * b))


def test_missing_dtype_names_the_measured_ones() -> None:
    with pytest.raises(ValueError, match=r"no bf16 kernels.*fp32"):
        _calibration().kernels("bf16")


# ---- fits -------------------------------------------------------------------------------------
def test_link_fit_recovers_a_ring_all_reduce() -> None:
    """Points made by the textbook 2-rank ring all-reduce (two steps, each moving half the
    tensor) on a link of `bw` (after the bus efficiency) and latency `lat`."""
    bw, lat = 2e9, 5e-5
    eff = bw * BUS_EFFICIENCY_INTRA
    points = [
        CollectivePoint(
            kind=CollectiveKind.ALL_REDUCE,
            ranks=2,
            nbytes=s,
            seconds=s / eff + 2 * (lat + HALF_BANDWIDTH_BYTES_INTRA / eff),
        )
        for s in (4096.0, 65536.0, 1e6, 16e6)
    ]
    got_bw, got_lat = fit_links(points)
    assert got_bw == pytest.approx(bw, rel=1e-6)
    assert got_lat == pytest.approx(lat, rel=1e-6)


def test_kind_links_recover_each_kinds_own_bandwidth_and_latency() -> None:
    """2-rank points made by hand, each kind on its own link: a ring all-reduce (two steps of
    half the tensor) on 2 GB/s with 1 ms per step, a reduce-scatter (one step of half the
    tensor) on 0.5 GB/s with 0.3 ms (gloo's runs at a fraction of its all-gather's rate), and
    a send/recv (one message) on 2 GB/s with 20 us; each is recovered from its own points, and
    a kind measured at one size keeps the shared bandwidth and fits its latency."""
    half = HALF_BANDWIDTH_BYTES_INTRA
    sizes = (4096.0, 65536.0, 1e6, 16e6)

    def points(kind: CollectiveKind, bw: float, lat: float, steps: int, share: float) -> list:
        eff = bw * BUS_EFFICIENCY_INTRA
        return [
            CollectivePoint(
                kind=kind, ranks=2, nbytes=s, seconds=share * s / eff + steps * (lat + half / eff)
            )
            for s in sizes
        ]

    measured = (
        points(CollectiveKind.ALL_REDUCE, 2e9, 1e-3, 2, 1.0)
        + points(CollectiveKind.REDUCE_SCATTER, 0.5e9, 3e-4, 1, 0.5)
        + points(CollectiveKind.SEND_RECV, 2e9, 2e-5, 1, 1.0)
    )
    one_size = points(CollectiveKind.ALL_GATHER, 2e9, 5e-4, 1, 0.5)[:1]
    links = fit_kind_links(measured + one_size, 2e9)
    got = {k.kind: (k.bw_bytes_per_s, k.latency_s) for k in links}
    for kind, (bw, lat) in (
        (CollectiveKind.ALL_REDUCE, (2e9, 1e-3)),
        (CollectiveKind.REDUCE_SCATTER, (0.5e9, 3e-4)),
        (CollectiveKind.SEND_RECV, (2e9, 2e-5)),
    ):
        assert got[kind][0] == pytest.approx(bw, rel=0.02), kind
        assert got[kind][1] == pytest.approx(lat, rel=0.05), kind
    assert got[CollectiveKind.ALL_GATHER][0] == 2e9
    assert got[CollectiveKind.ALL_GATHER][1] == pytest.approx(5e-4, rel=0.02)
    assert CollectiveKind.ALL_TO_ALL not in got


def test_a_kinds_own_link_prices_its_collectives() -> None:
    """`Collectives` with a measured reduce-scatter link prices a reduce-scatter on it and the
    other kinds on the shared link."""
    from paraplan.planner.cost.comm import AxisLink, Collectives
    from paraplan.planner.hardware import get_accelerator

    acc = get_accelerator("cpu")
    link = AxisLink(2, 2, 1)
    shared = Collectives(acc)
    own = Collectives(acc, kind_links={CollectiveKind.REDUCE_SCATTER: (0.5e9, 3e-4)})
    nbytes = 16e6
    eff = 0.5e9 * BUS_EFFICIENCY_INTRA
    want = 0.5 * nbytes / eff + 3e-4 + HALF_BANDWIDTH_BYTES_INTRA / eff
    assert own.reduce_scatter(nbytes, link) == pytest.approx(want)
    assert own.all_gather(nbytes, link) == shared.all_gather(nbytes, link)


def test_refit_scales_time_and_shifts_memory() -> None:
    cal = _calibration()
    samples = [
        RunSample(
            step_time_s=2.0 * p,
            predicted_step_time_s=p,
            peak_memory_bytes=m + 1e8,
            predicted_memory_bytes=m,
        )
        for p, m in ((0.1, 5e8), (0.2, 6e8), (0.4, 7e8))
    ]
    new, scales = refit(cal, samples, accelerator="cpu")  # reports without their parts
    assert new.time_scale == pytest.approx(2.0)
    assert scales.comm == scales.optimizer == scales.compute
    assert new.comm_scale == pytest.approx(1.0) and new.optimizer_scale == pytest.approx(1.0)
    assert new.refit_runs == 3
    assert new.figures["runtime_overhead_bytes"] == 300 * 2**20 + 10**8
    kern = new.kernels("fp32")
    assert kern.gemm_s(64, 64, 64) == pytest.approx(2 * cal.kernels("fp32").gemm_s(64, 64, 64))
    assert new.figures["memory_bw_bytes_per_s"] == pytest.approx(2.5e9)  # rates halve too
    before = cluster_from_dict(_cluster_dict(cal)).accelerator
    after = cluster_from_dict(_cluster_dict(new)).accelerator
    assert after.intra_node_latency_s == pytest.approx(2 * before.intra_node_latency_s)
    assert after.peak_flops["fp32"] == pytest.approx(before.peak_flops["fp32"] / 2)


def test_run_sample_rejects_other_json() -> None:
    with pytest.raises(ValueError, match="not a run report"):
        run_sample({"schema_version": 3}, origin="plan.json")


# ---- warnings and hints -----------------------------------------------------------------------
def test_device_mismatch_warns_only_for_another_device() -> None:
    assert _calibration().device_mismatch("cpu") is None
    assert "h100" in (_calibration().device_mismatch("h100") or "")
    gpu = _calibration(DeviceKind.CUDA, "NVIDIA H100 80GB HBM3")
    assert gpu.device_mismatch("h100") is None
    assert gpu.device_mismatch("a100-80gb") is not None


def test_plan_command_warns_about_a_calibration_from_another_device(tmp_path: Path) -> None:
    gpu_cal = _calibration(DeviceKind.CUDA, "NVIDIA A100-SXM4-80GB")
    data = _cluster_dict(dataclasses.replace(gpu_cal, figures={}), accelerator="h100")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "paraplan",
            "plan",
            "--model",
            "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64",
            "--cluster",
            str(path),
            "--global-batch",
            "8",
            "--precision",
            "fp32",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "warning: the calibration was measured on 'NVIDIA A100-SXM4-80GB'" in done.stderr
    assert "run paraplan calibrate on the target machine" in done.stderr


def test_recalibrate_hint_only_over_twenty_percent() -> None:
    assert recalibrate_hint(0.19) is None and recalibrate_hint(None) is None
    hint = recalibrate_hint(-0.31, "2xcpu") or ""
    assert "-31%" in hint and "paraplan calibrate --from-run" in hint
    assert "paraplan calibrate --cluster 2xcpu -o cal.yaml" in hint


# ---- the closed loop, for real ------------------------------------------------------------------
@pytest.mark.multiprocess
def test_closed_loop_on_two_gloo_ranks(tmp_path: Path) -> None:
    """`paraplan calibrate --quick` on 2 gloo ranks, a DDP plan of the tiny GPT-2 on the
    catalog `2xcpu` and on the calibrated cluster, one run under the calibrated plan. Loose,
    as the machine is shared: the calibrated prediction is closer to the measurement than the
    catalog's (both under-predict this dispatch-bound model), and after `--from-run` on that
    run the re-planned step time and memory match it (the refit reaches every term)."""
    cal = tmp_path / "cal.yaml"
    done = subprocess.run(
        [*PARAPLAN, "calibrate", "--cluster", "2xcpu", "-o", str(cal), *QUICK_FP32],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "GEMM peak" in done.stdout and "links (fitted on" in done.stdout
    assert "DTensor host per TP block" in done.stdout and "per GEMM shape" in done.stdout
    assert "DTensor host of the vocabulary-parallel loss" in done.stdout
    # memory in binary units, as every output (issue 16): runtime memory 458 MB read 437 MiB
    assert re.search(r"runtime memory per rank [\d.]+ (MiB|GiB)", done.stdout), done.stdout
    calibrated = load_cluster_file(cal)
    assert calibrated.calibration is not None and calibrated.calibration.world_size == 2
    # the executor's TP wrappers run DTensor's sharding propagation and redistributions in
    # Python on every wrapped module: a block of each kind pays far more than a few plain
    # operators, forward and backward
    tp = calibrated.calibration.tensor_parallel
    plain_s = calibrated.calibration.kernels("fp32").fit.launch_s
    assert tp is not None and len(tp.blocks) == 4
    assert all(min(b.fwd_s, b.bwd_s) > 20 * plain_s for b in tp.blocks), tp
    # torch's loss_parallel spells the log-softmax and the loss out in DTensor handlers, each
    # operator dispatched in Python: its forward costs more than a dozen plain operators
    assert tp.loss_fwd_s > 12 * plain_s, tp
    # an AdamW step over DTensor parameters (FSDP2, TP) dispatches each operator through
    # DTensor: dearer per tensor than ADAMW_OPS_PER_TENSOR plain operators
    assert calibrated.calibration.dtensor_adamw_tensor_s > 10 * plain_s
    # FSDP2 handles each parameter tensor of a unit on its own (views of the gathered
    # buffer, the sharded gradient made a DTensor): more than one plain operator each
    assert calibrated.calibration.fsdp_tensor_host_s > plain_s
    # DTensor's modules, propagation caches and op code stay resident once the TP blocks ran
    # (~6-8 MB on this CPU, 2026-11-26): more than a page, less than the runtime itself
    # a collective after host work waits for the slower rank: measured, and well under a
    # tiny step's (30-90 ms) share (0.2-0.4 ms on this VM quiet, 2026-11-26)
    assert 0.0 <= calibrated.calibration.sync_skew_s < 5e-3
    tp_bytes = calibrated.calibration.tp_runtime_bytes
    assert 2**20 < tp_bytes < calibrated.accelerator.runtime_overhead_bytes, tp_bytes
    # a checkpoint region's own host work costs more than one operator on every measured
    # dtype: its entry and exit, and per saved tensor three Python hooks (pack, the
    # recompute's pack, unpack)
    fits = [d.fit for d in calibrated.calibration.dtype_kernels]
    assert fits and all(f.checkpoint_region_s > f.launch_s for f in fits)
    assert all(f.checkpoint_saved_tensor_s > f.launch_s for f in fits)

    import paraplan
    from paraplan.executor.launch import run_plan
    from paraplan.planner.plan_io import save_plan

    config = ROOT / "examples" / "configs" / "gpt2-tiny.json"
    profile = paraplan.model_profile(str(config), seq_len=64, precision="fp32")
    pins = "dp=2,tp=1,pp=1,zero=0,mbs=4,recompute=none,offload=false"

    def predict(cluster: object) -> tuple[float, float, object]:
        plan = paraplan.plan(profile, cluster, global_batch=8, precision="fp32", fix=pins).plan
        return plan.predicted.step_time_s, plan.predicted.memory_per_gpu_bytes, plan

    catalog_s, _, _ = predict("2xcpu")
    calibrated_s, calibrated_bytes, plan = predict(calibrated)
    plan_file, report = tmp_path / "plan.json", tmp_path / "report.json"
    save_plan(plan, plan_file)
    args = ["--model", str(config), "--steps", "8", "--warmup", "3", "--report", str(report)]
    assert run_plan(plan_file, str(ROOT / "examples" / "train_gpt2.py"), args) == 0
    r = json.loads(report.read_text())
    measured_s, measured_bytes = r["step_time_s"], max(r["peak_memory_bytes"])
    assert abs(math.log(measured_s / calibrated_s)) < abs(math.log(measured_s / catalog_s)), r
    # memory as the plan prices it (runtime + live tensors; the RSS also holds glibc's
    # retained heap): the calibrated runtime footprint brings it within a loose 10%
    assert "glibc" in r["memory_source"] and max(r["peak_rss_bytes"]) >= measured_bytes
    assert calibrated_bytes == pytest.approx(measured_bytes, rel=0.10), r

    refitted = tmp_path / "cal2.yaml"
    done = subprocess.run(
        [*PARAPLAN, "calibrate", "--from-run", str(report), "--cluster", str(cal), "-o", refitted],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    again = load_cluster_file(refitted)
    assert again.calibration is not None and again.calibration.refit_runs == 1
    step_s, memory_bytes, _ = predict(again)
    assert step_s == pytest.approx(measured_s, rel=0.10)
    assert memory_bytes == pytest.approx(measured_bytes, rel=0.05)


def test_busy_machine_warning_names_the_load() -> None:
    from paraplan.cli.calibrate import busy_machine_warning

    assert busy_machine_warning(0.4, 2) is None and busy_machine_warning(1.0, 2) is None
    text = busy_machine_warning(3.1, 2)
    assert text is not None and "load 3.1 on 2 CPUs" in text and "load_average" in text


def test_cpu_attention_is_linear_in_batch_at_its_length() -> None:
    """On a host CPU a fused attention call's time grows linearly with batch x heads at a given
    sequence length (causal SDPA on this CPU, one thread, 4 heads of 16 over 128 tokens,
    2026-11-29: backward 1.27 / 2.49 / 4.83 / 9.6 ms in bf16 at batch 1 / 2 / 4 / 8), so the
    curve is read at the call's own length, the point of 256 heads x head size there. On a
    GPU it is read by FLOPs (its rate grows with the rows that fill it): a larger batch reads a
    faster point of this curve (rates rise with FLOPs)."""
    from paraplan.planner.cost.calibrated import CURVE_WIDTH

    seq, one = 128, 4.0 * 64 * 128 * 128  # one sequence of 4 heads of 16
    cpu, gpu = CalibratedKernels(_fit()), CalibratedKernels(_fit(), async_launch=True)
    base = cpu.attention_s(one, head_dim=16, seq_len=seq)
    for batch in (2, 4, 8):
        f, b = cpu.attention_s(one * batch, head_dim=16, seq_len=seq)
        assert (f, b) == pytest.approx((batch * base[0], batch * base[1]), rel=1e-12)
    point = 4.0 * CURVE_WIDTH * seq * seq  # the curve's own call at this length
    at_point = cpu.attention_s(point, head_dim=16)  # read by FLOPs: the same point
    assert cpu.attention_s(point, head_dim=16, seq_len=seq) == pytest.approx(at_point)
    g1 = gpu.attention_s(one, head_dim=16, seq_len=seq)[1]
    assert gpu.attention_s(4 * one, head_dim=16, seq_len=seq)[1] < 4 * g1
