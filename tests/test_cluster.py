"""Accelerator catalog and cluster parsing (fast, CPU only)."""

from __future__ import annotations

import json
import math

import pytest

from paraplan.planner.cluster import (
    Cluster,
    cluster_from_dict,
    load_cluster_file,
    make_cluster,
    parse_cluster,
    preset_names,
    save_cluster_file,
)
from paraplan.planner.hardware import (
    ACCELERATORS,
    CALIBRATION_SOURCE,
    DTYPES,
    NUMERIC_FIELDS,
    calibration_overrides,
    get_accelerator,
    with_calibration,
)

GiB = 1024**3

# --- catalog ---------------------------------------------------------------------------------


def test_catalog_has_the_documented_entries():
    expected = {
        "a100-40gb",
        "a100-80gb",
        "h100",
        "h100-hbm2e",
        "h100-pcie",
        "h200",
        "b200",
        "gb200",
        "l4",
        "v100",
        "mi300x",
        "cpu",
    }
    assert set(ACCELERATORS) == expected


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_every_figure_is_positive_and_cited(name):
    acc = ACCELERATORS[name]
    assert acc.name == name
    assert acc.description
    for field in NUMERIC_FIELDS:
        assert acc.sources.get(field), f"{name}: no source for {field}"
    assert acc.peak_flops and set(acc.peak_flops) <= set(DTYPES)
    for dtype, flops in acc.peak_flops.items():
        assert math.isfinite(flops) and flops > 0, (name, dtype)
    for field in NUMERIC_FIELDS[1:]:
        value = getattr(acc, field)
        assert math.isfinite(value) and value > 0, (name, field)
    assert isinstance(acc.memory_bytes, int)
    assert isinstance(acc.runtime_overhead_bytes, int)
    assert acc.runtime_overhead_bytes < acc.memory_bytes
    assert 0 < acc.matmul_efficiency <= 1


def test_h100_figures_match_the_datasheet():
    h100 = get_accelerator("h100")
    # NVIDIA H100 datasheet, SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense.
    assert h100.peak_flops_for("bf16") == 989.4e12
    assert h100.peak_flops_for("fp8") == 1978.9e12
    assert h100.memory_bytes == 80 * GiB
    assert h100.intra_node_bw_bytes_per_s == 450e9  # NVLink 900 GB/s bidirectional
    assert h100.inter_node_bw_bytes_per_s == 50e9  # one 400 Gb/s NIC per GPU


def test_gb200_figures_are_the_nvl72_rack_over_72_gpus():
    """NVIDIA GB200 NVL72 specifications per rack of 72 GPUs: FP16/BF16 360 PFLOPS and FP8 720
    with sparsity, HBM3e at 576 TB/s, NVLink 130 TB/s (both directions); the NVLink domain of
    72 GPUs is the node a cluster of them is cut into unless told otherwise."""
    gb200 = get_accelerator("gb200")
    assert gb200.peak_flops_for("bf16") == 360e15 / 2 / 72
    assert gb200.peak_flops_for("fp8") == 720e15 / 2 / 72
    assert gb200.memory_bw_bytes_per_s == 576e12 / 72
    assert gb200.intra_node_bw_bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.01)
    assert parse_cluster("144xgb200").gpus_per_node == 72
    assert parse_cluster("256xgb200", gpus_per_node=64).num_nodes == 4
    with pytest.raises(ValueError, match="not a multiple of 72 GPUs per node"):
        parse_cluster("256xgb200")


def test_figures_are_ordered_as_the_hardware_is():
    a100, h100, h200, b200 = (get_accelerator(n) for n in ("a100-80gb", "h100", "h200", "b200"))
    assert a100.peak_flops_for("bf16") < h100.peak_flops_for("bf16") < b200.peak_flops_for("bf16")
    assert h200.peak_flops == h100.peak_flops
    assert h100.memory_bytes < h200.memory_bytes < b200.memory_bytes
    for acc in ACCELERATORS.values():
        if "fp16" in acc.peak_flops and "fp32" in acc.peak_flops and acc.name != "cpu":
            assert acc.peak_flops["fp16"] > acc.peak_flops["fp32"]


def test_lookup_is_case_insensitive_and_knows_aliases():
    assert get_accelerator("H100") is get_accelerator("h100")
    assert get_accelerator("h100-sxm") is get_accelerator("h100")
    assert get_accelerator(" A100-80GB ") is ACCELERATORS["a100-80gb"]


def test_unknown_accelerator_names_the_token_and_the_catalog():
    with pytest.raises(ValueError, match=r"unknown accelerator 'tpu-v5'.*a100-40gb.*mi300x"):
        get_accelerator("tpu-v5")


def test_missing_dtype_names_it_and_lists_the_ones_available():
    with pytest.raises(ValueError, match=r"'bf16'.*fp32, fp16"):
        get_accelerator("v100").peak_flops_for("bf16")
    assert get_accelerator("v100").peak_flops_for("FP16") == 125e12


# --- calibration -----------------------------------------------------------------------------


def test_calibration_overrides_figures_and_sources():
    h100 = get_accelerator("h100")
    cal = with_calibration(h100, {"matmul_efficiency": 0.55, "inter_node_bw_bytes_per_s": 4e10})
    assert cal.matmul_efficiency == 0.55
    assert cal.inter_node_bw_bytes_per_s == 4e10
    assert cal.sources["matmul_efficiency"] == CALIBRATION_SOURCE
    assert cal.sources["inter_node_bw_bytes_per_s"] == CALIBRATION_SOURCE
    assert cal.sources["memory_bytes"] == h100.sources["memory_bytes"]
    assert h100.matmul_efficiency != 0.55  # the catalog entry is untouched


def test_peak_flops_calibration_merges_by_dtype():
    h100 = get_accelerator("h100")
    cal = with_calibration(h100, {"peak_flops": {"BF16": 8e14}})
    assert cal.peak_flops_for("bf16") == 8e14
    assert cal.peak_flops_for("fp8") == h100.peak_flops_for("fp8")
    assert cal.sources["peak_flops"].startswith(CALIBRATION_SOURCE)
    assert calibration_overrides(cal) == {"peak_flops": {"bf16": 8e14}}
    # a dtype the catalog lacks can be measured and added
    v100 = with_calibration(get_accelerator("v100"), {"peak_flops": {"bf16": 3e13}})
    assert v100.peak_flops_for("bf16") == 3e13


def test_integer_fields_accept_whole_floats():
    cal = with_calibration(get_accelerator("a100-40gb"), {"memory_bytes": 4.0e10})
    assert cal.memory_bytes == 40_000_000_000 and isinstance(cal.memory_bytes, int)


@pytest.mark.parametrize(
    ("overrides", "token"),
    [
        ({"flops": 1.0}, "'flops'"),
        ({"matmul_efficiency": 0.0}, "matmul_efficiency"),
        ({"matmul_efficiency": 1.5}, "matmul_efficiency"),
        ({"memory_bw_bytes_per_s": float("inf")}, "memory_bw_bytes_per_s"),
        ({"memory_bw_bytes_per_s": "fast"}, "memory_bw_bytes_per_s"),
        ({"intra_node_latency_s": -1e-6}, "intra_node_latency_s"),
        ({"memory_bytes": 1.5}, "memory_bytes"),
        ({"peak_flops": {"int4": 1e15}}, "'int4'"),
        ({"peak_flops": 8e14}, "peak_flops"),
    ],
)
def test_bad_calibration_is_rejected_with_the_field_named(overrides, token):
    with pytest.raises(ValueError, match=token):
        with_calibration(get_accelerator("h100"), overrides)


def test_unknown_calibration_field_lists_the_calibratable_ones():
    with pytest.raises(ValueError, match=r"'flops'.*matmul_efficiency"):
        with_calibration(get_accelerator("h100"), {"flops": 1.0})


# --- presets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "acc", "nodes", "per_node"),
    [
        ("8xh100", "h100", 1, 8),
        ("1024xa100-80gb", "a100-80gb", 128, 8),
        ("16384xh100", "h100", 2048, 8),
        ("2xcpu", "cpu", 1, 2),
        ("8xl4", "l4", 1, 8),
        ("8XH100", "h100", 1, 8),
        ("64xh100-sxm", "h100", 8, 8),
        ("16xmi300x", "mi300x", 2, 8),
    ],
)
def test_presets_parse(text, acc, nodes, per_node):
    cluster = parse_cluster(text)
    assert cluster.accelerator is get_accelerator(acc)
    assert (cluster.num_nodes, cluster.gpus_per_node) == (nodes, per_node)
    assert cluster.num_gpus == nodes * per_node
    assert cluster.name == f"{nodes * per_node}x{acc}"


def test_gpus_per_node_override():
    cluster = parse_cluster("16xh100", gpus_per_node=4)
    assert (cluster.num_nodes, cluster.gpus_per_node) == (4, 4)
    assert parse_cluster("12xh100", gpus_per_node=4).num_nodes == 3
    assert parse_cluster("2xh100", gpus_per_node=8).gpus_per_node == 2


def test_make_cluster_is_the_flag_form():
    assert make_cluster("h100", 1024, gpus_per_node=8) == parse_cluster("1024xh100")


def test_preset_names_parse():
    for name in preset_names():
        assert parse_cluster(name).num_gpus == 8


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("8xfoo", "'foo'"),
        ("8h100", "'8h100'"),
        ("0xh100", "'0xh100'"),
        ("12xh100", "'12xh100'"),
        ("h100", "'h100'"),
        ("", "''"),
    ],
)
def test_bad_presets_name_the_token(text, token):
    with pytest.raises(ValueError, match=token):
        parse_cluster(text)


def test_malformed_preset_lists_the_accepted_forms():
    with pytest.raises(ValueError, match=r"'<N>x<accelerator>'.*\.json/\.yaml.*h100"):
        parse_cluster("eight-h100s")


def test_non_multiple_of_node_size_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"12 GPUs is not a multiple of 8.*--gpus-per-node"):
        parse_cluster("12xh100")


@pytest.mark.parametrize(("nodes", "per_node"), [(0, 8), (2, 0), (-1, 8), (True, 8)])
def test_cluster_validates_its_shape(nodes, per_node):
    with pytest.raises(ValueError, match="positive integer"):
        Cluster(
            name="x", accelerator=get_accelerator("h100"), num_nodes=nodes, gpus_per_node=per_node
        )


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_file_round_trip(tmp_path, suffix):
    acc = with_calibration(
        get_accelerator("h100"),
        {"matmul_efficiency": 0.6, "peak_flops": {"bf16": 8.5e14}, "memory_bytes": 79 * GiB},
    )
    cluster = Cluster(name="lab", accelerator=acc, num_nodes=4, gpus_per_node=8)
    path = tmp_path / f"cluster{suffix}"
    save_cluster_file(cluster, path)
    again = parse_cluster(str(path))
    assert again == cluster
    assert again.fingerprint() == cluster.fingerprint()
    assert again.to_dict() == cluster.to_dict()


def test_handwritten_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "accelerator: A100-80GB\nnodes: 2\ngpus_per_node: 8\n"
        "calibration:\n  inter_node_bw_bytes_per_s: 2.2e10\n  peak_flops: {bf16: 2.5e14}\n"
    )
    cluster = parse_cluster(str(path))
    assert cluster.name == "16xa100-80gb"
    assert cluster.num_gpus == 16
    assert cluster.accelerator.inter_node_bw_bytes_per_s == 2.2e10
    assert cluster.accelerator.peak_flops_for("bf16") == 2.5e14


def test_handwritten_json_file_without_calibration(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"name": "pod", "accelerator": "h100", "nodes": 2, "gpus_per_node": 8})
    )
    cluster = load_cluster_file(path)
    assert cluster == Cluster(
        name="pod", accelerator=get_accelerator("h100"), num_nodes=2, gpus_per_node=8
    )
    assert cluster.to_dict()["calibration"] == {}
    with pytest.raises(ValueError, match="gpus_per_node=4"):
        parse_cluster(str(path), gpus_per_node=4)


@pytest.mark.parametrize(
    ("data", "token"),
    [
        ({"accelerator": "h100", "nodes": 1, "gpus_per_node": 8, "gpus": 8}, "'gpus'"),
        ({"accelerator": "h100", "gpus_per_node": 8}, "nodes"),
        ({"accelerator": "h100", "nodes": "2", "gpus_per_node": 8}, "'nodes'"),
        ({"accelerator": "h100", "nodes": 2.0, "gpus_per_node": 8}, "'nodes'"),
        ({"accelerator": "h100", "nodes": 0, "gpus_per_node": 8}, "num_nodes"),
        ({"accelerator": "h9000", "nodes": 1, "gpus_per_node": 8}, "'h9000'"),
        ({"accelerator": 100, "nodes": 1, "gpus_per_node": 8}, "'accelerator'"),
        ({"accelerator": "h100", "nodes": 1, "num_nodes": 1, "gpus_per_node": 8}, "num_nodes"),
        (
            {"accelerator": "h100", "nodes": 1, "gpus_per_node": 8, "calibration": [1]},
            "calibration",
        ),
        ({"accelerator": "h100", "nodes": 1, "gpus_per_node": 8, "calibration": {"x": 1}}, "'x'"),
        (["h100"], "mapping"),
    ],
)
def test_bad_cluster_files_name_the_problem(tmp_path, data, token):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=token) as info:
        parse_cluster(str(path))
    assert str(path) in str(info.value)


def test_unknown_key_lists_the_allowed_keys():
    with pytest.raises(ValueError, match=r"'gpu'.*allowed keys are name, accelerator"):
        cluster_from_dict({"accelerator": "h100", "nodes": 1, "gpus_per_node": 8, "gpu": "x"})


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ValueError, match=r"nowhere\.yaml"):
        parse_cluster(str(missing))


def test_unparseable_files_are_value_errors(tmp_path):
    bad_json = tmp_path / "c.json"
    bad_json.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_cluster(str(bad_json))
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("a: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_cluster(str(bad_yaml))


def test_existing_file_without_suffix_is_read_as_yaml(tmp_path):
    path = tmp_path / "mycluster"
    path.write_text("accelerator: cpu\nnodes: 1\ngpus_per_node: 2\n")
    assert parse_cluster(str(path)).num_gpus == 2


# --- fingerprint -----------------------------------------------------------------------------


def test_fingerprint_is_stable_and_sensitive():
    a, b = parse_cluster("8xh100"), parse_cluster("8xH100")
    assert a.fingerprint() == b.fingerprint()
    assert len(a.fingerprint()) == 16 and int(a.fingerprint(), 16) >= 0
    assert a.fingerprint() != parse_cluster("16xh100").fingerprint()
    assert a.fingerprint() != parse_cluster("8xh200").fingerprint()
    calibrated = Cluster(
        name=a.name,
        accelerator=with_calibration(a.accelerator, {"matmul_efficiency": 0.5}),
        num_nodes=1,
        gpus_per_node=8,
    )
    assert calibrated.fingerprint() != a.fingerprint()


def test_fingerprint_ignores_int_versus_float_spelling():
    cluster = parse_cluster("8xh100")
    as_int = with_calibration(cluster.accelerator, {"inter_node_bw_bytes_per_s": 40_000_000_000})
    as_float = with_calibration(cluster.accelerator, {"inter_node_bw_bytes_per_s": 4e10})
    assert as_int == as_float


def test_fingerprint_is_pinned():
    # A literal pins the digest across processes and Python versions. If a catalog figure
    # changes on purpose, update it: plans made against the old figures then stop matching.
    assert parse_cluster("2xcpu").fingerprint() == "70922b7840bbd826"


def test_to_dict_is_json_and_reads_back():
    cluster = parse_cluster("64xb200")
    data = json.loads(json.dumps(cluster.to_dict()))
    assert data == {
        "name": "64xb200",
        "accelerator": "b200",
        "num_nodes": 8,
        "gpus_per_node": 8,
        "calibration": {},
    }
    assert cluster_from_dict(data) == cluster


def test_clusters_are_hashable():
    assert (
        len({parse_cluster("8xh100"), parse_cluster("8xh100"), parse_cluster("8xa100-40gb")}) == 2
    )


def test_planner_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, paraplan.planner.cluster, paraplan.planner.hardware;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
