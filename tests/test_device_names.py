"""`accelerator_for_device_name`: the names torch reports for CUDA/ROCm devices map to the
catalog, and devices the catalog lacks map to None (never to a look-alike)."""

from __future__ import annotations

import pytest

from paraplan.planner.hardware import ACCELERATORS, accelerator_for_device_name

GIB = 2**30


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA L4", "l4"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_reported_names_map_to_the_catalog(reported: str, expected: str) -> None:
    assert accelerator_for_device_name(reported) == expected
    assert expected in ACCELERATORS


def test_a100_is_told_apart_by_its_memory() -> None:
    name = "NVIDIA A100-SXM4-80GB"
    assert accelerator_for_device_name(name, memory_bytes=80 * GIB) == "a100-80gb"
    assert accelerator_for_device_name("NVIDIA A100-SXM4-40GB", memory_bytes=40 * GIB) == (
        "a100-40gb"
    )
    assert accelerator_for_device_name(name) is None  # memory unknown: not guessed


@pytest.mark.parametrize(
    "reported", ["NVIDIA L40S", "NVIDIA GeForce RTX 4090", "NVIDIA H1000", "Tesla T4", ""]
)
def test_unknown_devices_are_none(reported: str) -> None:
    assert accelerator_for_device_name(reported, memory_bytes=24 * GIB) is None
