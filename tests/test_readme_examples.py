"""The README's quoted output is the real output: every ```console block whose first line is
`$ paraplan ...` is run in process, and each further line must appear in what it prints (no
stale figures)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from paraplan.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.DOTALL)


def _blocks() -> list[tuple[list[str], list[str]]]:
    out = []
    for body in BLOCK.findall(README.read_text(encoding="utf-8")):
        first, *rest = body.strip("\n").splitlines()
        if first.startswith("$ paraplan "):
            out.append((shlex.split(first[len("$ paraplan ") :]), [r for r in rest if r.strip()]))
    return out


def test_readme_has_checked_examples() -> None:
    assert _blocks(), "README.md has no ```console block starting with `$ paraplan`"


@pytest.mark.parametrize(("argv", "expected"), _blocks(), ids=lambda v: " ".join(v)[:40])
def test_readme_output_is_current(
    argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*argv, "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0
    missing = [line for line in expected if line not in printed]
    assert not missing, f"README.md quotes lines `paraplan {' '.join(argv)}` no longer prints"


def test_readme_quotes_the_catalog_peak_behind_tflops() -> None:
    """The prose's peak is the catalog's, and the quoted TFLOP/s per GPU is MFU x that peak."""
    from paraplan.planner.hardware import get_accelerator

    text = README.read_text(encoding="utf-8")
    stated = re.search(r"(\d+) TFLOP/s for an A100 in bf16", text)
    assert stated is not None
    peak = get_accelerator("a100-80gb").peak_flops_for("bf16")
    assert int(stated.group(1)) == round(peak / 1e12)
    quoted = re.search(r"MFU (\d+\.\d)% \((\d+\.\d) TFLOP/s per GPU\)", text)
    assert quoted is not None  # rounded figures: within half a unit of each's last digit
    mfu, tflops = float(quoted.group(1)) / 100, float(quoted.group(2))
    assert abs(mfu * peak / 1e12 - tflops) <= 0.0005 * peak / 1e12 + 0.05
