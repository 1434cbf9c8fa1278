"""The package's shape: no import cycles (not even through imports inside functions or under
TYPE_CHECKING), no import-time side effects on the environment, no module over 500 lines, and
the planner never importing torch, the executor or the front door."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "paraplan": "paraplan",
    "paraplan.planner": "planner",
    "paraplan.profiler": "profiler",
    "paraplan.executor": "executor",
}
MAX_LINES = 500
THIRD_PARTY = (
    "torch",
    "torch.distributed.checkpoint",
    "torch.distributed.pipelining",
    "torch.distributed.fsdp",
    "transformers",
    "matplotlib",
    "pulp",
)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str], *, top_level_only: bool) -> set[str]:
    """Modules of the package that `name` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts) + (f".{node.module}" if node.module else "")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            # importing a.b.c runs a/__init__ and a/b/__init__ first
            pieces = target.split(".")
            for i in range(1, len(pieces) + 1):
                prefix = ".".join(pieces[:i])
                if prefix in known and prefix != name and not name.startswith(prefix + "."):
                    found.add(prefix)
    return found


def _graph(*, top_level_only: bool) -> nx.DiGraph:
    mods = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        for target in _imports(name, path, set(mods), top_level_only=top_level_only):
            graph.add_edge(name, target)
    return graph


@pytest.mark.parametrize("top_level_only", [True, False], ids=["top-level", "all imports"])
def test_no_import_cycles(top_level_only: bool) -> None:
    cycles = list(nx.simple_cycles(_graph(top_level_only=top_level_only)))
    assert not cycles, f"import cycles: {sorted(cycles, key=len)[:5]}"


def test_planner_imports_neither_executor_profiler_nor_front_door() -> None:
    graph = _graph(top_level_only=False)
    for name in graph:
        if not name.startswith("paraplan.planner"):
            continue
        for target in graph.successors(name):
            assert target.startswith("paraplan.planner"), f"{name} imports {target}"
        source = _modules()[name].read_text()
        assert "import torch" not in source, f"{name} imports torch"


def test_profiler_and_executor_keep_to_their_rows() -> None:
    """docs/architecture.md's table: the profiler imports no executor module; the executor
    imports of the profiler only its resident-memory readers, the host probe and the module
    digest (each
    through the package's `__init__`, which the graph lists as an import of its own)."""
    allowed = {
        "paraplan.profiler",
        "paraplan.profiler.host_memory",
        "paraplan.profiler.host_probe",
        "paraplan.profiler.chain",
    }
    graph = _graph(top_level_only=False)
    for name in graph:
        for target in graph.successors(name):
            if name.startswith("paraplan.profiler"):
                assert not target.startswith("paraplan.executor"), f"{name} imports {target}"
            if name.startswith("paraplan.executor") and target.startswith("paraplan.profiler"):
                assert target in allowed, f"{name} imports {target}"


def test_no_module_over_the_line_limit() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}


def test_importing_any_module_changes_no_environment_variable() -> None:
    """Each module imported in a fresh interpreter (torch-dependent ones too, where torch is
    installed): the environment after equals the environment before."""
    script = (
        f"THIRD_PARTY = {THIRD_PARTY!r}\n"
        "import importlib, os, sys, json\n"
        "names = json.loads(sys.argv[1])\n"
        "for lib in THIRD_PARTY:\n"  # their own import-time effects are not ours
        "    try:\n"
        "        importlib.import_module(lib)\n"
        "    except ImportError:\n"
        "        pass\n"
        "changed = {}\n"
        "for name in names:\n"
        "    before = dict(os.environ)\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        changed[name] = 'import failed: ' + str(exc)\n"
        "        continue\n"
        "    after = dict(os.environ)\n"
        "    diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))\n"
        "    if diff:\n"
        "        changed[name] = diff\n"
        "print(json.dumps(changed))\n"
    )
    import json

    names = sorted(n for n in _modules() if not n.endswith("__main__"))  # entry points run
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MASTER_ADDR")}
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(names)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}
