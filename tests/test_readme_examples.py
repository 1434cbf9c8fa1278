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
