"""Output files (issue 14): the atomic writer never replaces a device, FIFO or folder, writes
through symbolic links, leaves no temporary file on any failure (a kill included), and every
`-o` refusal comes before the work, as one line and exit 2."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.planner.outputs import check_writable, write_atomic

from .robust_helpers import PLAN, Unprivileged, refused

ROOT = Path(__file__).resolve().parents[1]


def _make_node(path: Path) -> str:
    """A character device (like /dev/null) at `path`; a FIFO where mknod is not allowed."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        return "char"
    except (PermissionError, OSError):
        os.mkfifo(path)
        return "fifo"


def test_output_leaves_a_device_node_untouched_and_writes_through_a_symlink(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    kind = _make_node(node)
    before = os.lstat(node)
    refused(capsys, [*PLAN, "-o", str(node)], str(node), "not a regular file")
    link_to_node = tmp_path / "to-node.json"
    link_to_node.symlink_to(node)
    refused(capsys, [*PLAN, "-o", str(link_to_node)], "not a regular file")
    after = os.lstat(node)
    is_kind = stat.S_ISCHR if kind == "char" else stat.S_ISFIFO
    assert is_kind(after.st_mode) and after.st_ino == before.st_ino
    assert after.st_rdev == before.st_rdev and link_to_node.is_symlink()
    # documented behaviour on a symlink to a file: the file it points to is written
    real = tmp_path / "plans" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert main([*PLAN, "-o", str(link)]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().startswith("{") and main(["show", str(link)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "link.json",
        "node",
        "plans",
        "to-node.json",
    ]
    assert [p.name for p in real.parent.iterdir()] == ["real.json"]


@pytest.mark.parametrize(
    ("target", "needles"),
    [
        ("", ["-o", "''", "is not a path"]),
        ("   ", ["-o", "is not a path"]),
        ("{tmp}", ["{tmp}", "not a regular file"]),  # a folder
        ("{tmp}/missing/plan.json", ["does not exist"]),
        ("{tmp}/" + "a" * 300, ["cannot write", "File name too long"]),
        ("/proc/plan.json", ["cannot write '/proc/plan.json'"]),
        ("/sys/plan.json", ["cannot write '/sys/plan.json'"]),
    ],
    ids=["empty", "blank", "folder", "no-folder", "300-char-name", "proc", "sys"],
)
def test_bad_output_paths_are_refused_before_planning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str, needles: list[str]
) -> None:
    if target.startswith(("/proc", "/sys")) and not Path(target).parent.is_dir():
        pytest.skip(f"no {Path(target).parent} here")
    path = target.replace("{tmp}", str(tmp_path))
    refused(capsys, [*PLAN, "-o", path], *(n.replace("{tmp}", str(tmp_path)) for n in needles))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_read_only_folder_is_refused_before_planning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    with Unprivileged(tmp_path):
        refused(capsys, [*PLAN, "-o", str(folder / "p.json")], "Permission denied")
    assert list(folder.iterdir()) == []


def test_longest_valid_name_is_written(tmp_path: Path) -> None:
    """A 255-byte name is valid: its temporary name must be valid too."""
    path = tmp_path / ("b" * 255)
    write_atomic(path, "x")
    assert path.read_text() == "x" and [p.name for p in tmp_path.iterdir()] == [path.name]


# ---- the writer itself ------------------------------------------------------------------------
def test_writer_refuses_fifo_and_folder(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"pipe.*not a regular file"):
        write_atomic(fifo, "text")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"folder.*not a regular file"):
        write_atomic(folder, "text")
    with pytest.raises(ValueError, match=r"folder.*not a regular file"):
        check_writable(folder)
    assert folder.is_dir() and list(folder.iterdir()) == []
    link = tmp_path / "to-pipe"
    link.symlink_to(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        write_atomic(link, "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "pipe", "to-pipe"]


def test_writer_writes_through_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "data" / "plan.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    chain = tmp_path / "chain.json"
    chain.symlink_to(link)
    write_atomic(chain, "new")
    assert chain.is_symlink() and link.is_symlink()
    assert os.readlink(link) == str(real) and real.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "data" / "later.json")
    write_atomic(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "data" / "later.json").read_text() == "made"
    assert sorted(p.name for p in real.parent.iterdir()) == ["later.json", "plan.json"]


def test_writer_permissions_follow_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.txt", "a")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640


def test_writer_cleans_up_a_failed_write(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "bad \udc80 surrogate")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    with pytest.raises(ValueError, match="does not exist"):
        write_atomic(tmp_path / "no" / "f.txt", "x")
    with pytest.raises(ValueError, match="empty"):
        write_atomic("", "x")


_KILLED_WHILE_WRITING = textwrap.dedent(
    """
    import resource, signal, sys
    from paraplan.planner.outputs import write_atomic
    # A file-size limit: a write past it fails (EFBIG) or, with SIGXFSZ at its default
    # action, kills the process on the spot (Python ignores SIGXFSZ unless told otherwise).
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
    if sys.argv[2] == "kill":
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    write_atomic(sys.argv[1], "x" * (1 << 20))
    """
)


@pytest.mark.parametrize("how", ["error", "kill"])
def test_no_temporary_file_survives_a_failed_or_killed_write(tmp_path: Path, how: str) -> None:
    """A write that fails half-way (EFBIG), and a process killed half-way through its write
    (SIGXFSZ, as uncatchable as kill -9 at that point), leave the old file and nothing else."""
    target = tmp_path / "plan.json"
    target.write_text("old")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_WRITING, str(target), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if how == "kill":
        assert run.returncode == -25, run.stderr  # SIGXFSZ: killed, no Python cleanup ran
        if not _has_anonymous_temp_files(tmp_path):
            pytest.skip("no O_TMPFILE on this file system: a kill leaves the named temp file")
    else:
        assert run.returncode == 1 and "cannot write" in run.stderr, run.stderr
        assert "File too large" in run.stderr
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def _has_anonymous_temp_files(folder: Path) -> bool:
    try:
        os.close(os.open(folder, os.O_WRONLY | getattr(os, "O_TMPFILE", 0) | os.O_CLOEXEC))
    except OSError:
        return False
    return hasattr(os, "O_TMPFILE")


def test_one_atomic_writer() -> None:
    """Only planner/outputs.py renames temporary files into place: plans, profiles, clusters,
    schedules, run reports (`RunReport.save`) and checkpoint markers all use `write_atomic` (a
    report folder is swapped whole by its own code: a folder, not a file)."""
    writers = []
    for folder in ("paraplan", "planner", "profiler", "executor"):
        for f in (ROOT / folder).rglob("*.py"):
            text = f.read_text()
            if "os.replace(" in text or "mkstemp(" in text:
                writers.append(str(f.relative_to(ROOT)))
    assert writers == ["planner/outputs.py"]
    report = (ROOT / "executor" / "report.py").read_text()
    assert "write_atomic(path" in report
