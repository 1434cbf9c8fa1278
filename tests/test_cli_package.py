"""The command line as a package: `--help` and `--version` start without torch, the command
modules share `common` and never import each other, errors become one line and exit 2, and
progress bars stay off the terminal when stderr is not one."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from paraplan.cli import build_parser, main
from paraplan.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    fraction_callback,
    progress_bar,
    run_command,
    show_progress,
)

ROOT = Path(__file__).resolve().parents[1]
CLI_DIR = ROOT / "paraplan" / "cli"
COMMANDS = (
    "plan",
    "profile",
    "explain",
    "run",
    "show",
    "compare",
    "checkpoint",
    "calibrate",
    "export",
)
HEAVY = ("torch", "matplotlib", "transformers", "pulp")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )


def test_help_imports_no_torch_nor_matplotlib() -> None:
    code = (
        "import sys\n"
        "from paraplan.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "usage: paraplan" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"  # none of the heavy modules loaded


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command}" in out


def test_version_is_the_project_version(capsys) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"paraplan {version}"
    assert version == "0.1.0"


@pytest.mark.parametrize("module", ["paraplan", "paraplan.cli"])
def test_python_dash_m_runs_the_command_line(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "paraplan 0.1.0"


def _relative_imports(path: Path) -> set[str]:
    """Sibling modules `path` imports (`from . import x`, `from .x import y`), at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_command_modules_share_common_and_never_import_each_other() -> None:
    modules = {p.stem for p in CLI_DIR.glob("*.py")} - {"__init__", "__main__"}
    assert modules == {"common", *COMMANDS}
    for command in COMMANDS:
        assert _relative_imports(CLI_DIR / f"{command}.py") <= {"common"}, command
    assert _relative_imports(CLI_DIR / "common.py") == set()
    for path in CLI_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 500, path.name


def test_every_command_has_a_handler() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == set(COMMANDS)
    for name, command in sub.choices.items():
        handler = command.get_default("handler")
        assert callable(handler), name
        assert handler.__module__ == f"paraplan.cli.{name}"


def _absolute_imports(path: Path, package: list[str]) -> set[str]:
    """Every module `path` (in `package`) imports, relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(".".join([*base, name]) for name in names)
    return found


def test_planner_knows_nothing_of_the_front_door() -> None:
    planner = ROOT / "planner"
    for path in planner.rglob("*.py"):
        package = ["paraplan", "planner", *path.relative_to(planner).parts[:-1]]
        for name in _absolute_imports(path, package):
            assert not name.startswith(("paraplan.report", "paraplan.cli")), (path, name)
    # The resolution is right: the report (one level below paraplan/) reaches the planner.
    report = _absolute_imports(ROOT / "paraplan" / "report" / "render.py", ["paraplan", "report"])
    assert "paraplan.planner.plan" in report


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (ValueError("--top -1: give 0 or more"), ["--top -1: give 0 or more"]),
        (FileNotFoundError(2, "No such file or directory", "nope.json"), ["nope.json", "No such"]),
        (PermissionError(13, "Permission denied", "/root/p.json"), ["/root/p.json", "Permission"]),
    ],
)
def test_errors_become_one_line_and_exit_2(capsys, error: Exception, words: list[str]) -> None:
    def handler(args: argparse.Namespace) -> int:
        raise error

    assert run_command(handler, argparse.Namespace()) == EXIT_BAD_INPUT == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    for word in words:
        assert word in err


def test_broken_pipe_is_quiet_and_ctrl_c_exits_130(capsys) -> None:
    def pipe(args: argparse.Namespace) -> int:
        raise BrokenPipeError

    def interrupt(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    assert run_command(pipe, argparse.Namespace()) == 0
    assert capsys.readouterr().err == ""
    assert run_command(interrupt, argparse.Namespace()) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "paraplan: interrupted\n"


def test_missing_plan_file_exits_2_naming_it(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    for command in ("show", "explain"):
        assert main([command, str(missing)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("paraplan: error:") and "missing.json" in err


class _Terminal:
    """A stderr that says it is a terminal and swallows what is written."""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_progress_only_on_a_terminal_and_not_under_no_progress(monkeypatch) -> None:
    off, on = argparse.Namespace(no_progress=True), argparse.Namespace(no_progress=False)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert show_progress(on) and not show_progress(off)
    assert show_progress(argparse.Namespace())  # commands without --no-progress
    with progress_bar(on, desc="t", total=100, unit="%") as bar:
        update = fraction_callback(bar)
        assert update is not None
        update(0.25)
        assert bar.n == 25
        update(0.5)
        update(2.0)  # never past the end
        assert bar.n == 100
    with progress_bar(on, desc="t", total=100, unit="%", enabled=False) as bar:
        assert fraction_callback(bar) is None
    with progress_bar(off, desc="t", total=100, unit="%") as bar:
        assert fraction_callback(bar) is None


def test_no_progress_off_a_terminal(capsys) -> None:
    # Under pytest stderr is captured, not a terminal: no bar even without --no-progress.
    assert not show_progress(argparse.Namespace(no_progress=False))
    code = main(["plan", "--model", "gpt2", "--cluster", "8xh100", "--global-batch", "16"])
    assert code == 0
    assert "searching" not in capsys.readouterr().err
