"""The notebooks (issue 6) execute top to bottom.

Each notebook is read into memory and executed by nbclient on the `python3` kernel, which
jupyter_client starts with the interpreter running the tests (the venv's; checked below), with
notebooks/ as the working directory, as `jupyter-execute` runs them (notebooks/README.md). The
committed file is never rewritten: the executed copy goes to the test's temporary folder. A
cell that raises fails the test (nbclient's CellExecutionError).

The committed notebooks are also checked as files: executed with their outputs kept, opening
with a markdown cell, defining no library code, and small enough to review.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = (
    "01_gpt3_175b_on_1024_a100.ipynb",
    "02_scaling_llama3.ipynb",
    "03_checkpointing_gpt2_xl.ipynb",
    "04_predicted_vs_measured.ipynb",
    "06_schedules.ipynb",
)
"""Every notebook, in reading order (notebooks/README.md lists the same)."""
NEEDS_TORCH = {"03_checkpointing_gpt2_xl.ipynb", "04_predicted_vs_measured.ipynb"}
"""Notebooks that trace a Hugging Face config (03, 04) or train under torchrun (04)."""
KERNEL_NAME = "python3"
"""ipykernel's kernel: jupyter_client starts it with `sys.executable` (the interpreter running
the tests), since its kernel.json names plain "python"."""
CELL_TIMEOUT_S = 300
"""Seconds one cell may run (the slowest, notebook 04's three training runs, takes ~30 s)."""
KERNEL_STARTUP_S = 120
"""Seconds the kernel may take to start on a loaded machine."""
MAX_NOTEBOOK_BYTES = 1_000_000
"""Committed notebooks stay reviewable: PNG outputs at modest resolution."""
LIBRARY_CODE = re.compile(r"^\s*(async\s+def|def|class)\s", re.MULTILINE)
"""A function or class definition: library code belongs in the package, not a notebook."""

CASES = [
    pytest.param(name, marks=[pytest.mark.multiprocess]) if name.startswith("04_") else name
    for name in NOTEBOOKS
]


def _execute(nb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `nb` in place (in memory) with notebooks/ as the working directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # configs only: the kernel never downloads
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=KERNEL_STARTUP_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()


def _images(nb: Any) -> int:
    return sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
    )


def test_readme_lists_every_notebook() -> None:
    on_disk = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    assert on_disk == sorted(NOTEBOOKS), "add a new notebook to NOTEBOOKS and the README"
    readme = (NOTEBOOK_DIR / "README.md").read_text()
    for name in NOTEBOOKS:
        assert name in readme, f"notebooks/README.md does not list {name}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_executed_and_tidy(name: str) -> None:
    path = NOTEBOOK_DIR / name
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{name} is over 1 MB: lower the dpi"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown", f"{name} must open with what question it answers"
    assert nb.metadata.kernelspec.name == KERNEL_NAME
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not LIBRARY_CODE.search(cell.source), f"{name} cell {i} defines library code"
        assert cell.execution_count is not None, f"{name} cell {i} was not executed"
        assert not [o for o in cell.outputs if o.output_type == "error"], f"{name} cell {i}"
    assert _images(nb) >= 1, f"{name} has no figure in its saved outputs"


def test_kernel_runs_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    _execute(nb, monkeypatch)
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs).strip()
    assert Path(printed).resolve() == Path(sys.executable).resolve()


@pytest.mark.parametrize("name", CASES)
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if name in NEEDS_TORCH:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    try:
        _execute(nb, monkeypatch)
    finally:  # the executed copy, for a look when a cell fails; the committed file is untouched
        nbformat.write(nb, tmp_path / name)
    assert nb.cells[0].cell_type == "markdown"
    assert _images(nb) >= 1, f"{name} drew no figure"
