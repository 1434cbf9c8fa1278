"""The `latest` marker of a checkpoint folder (issue 14): `--resume` loads only a `step-<n>`
folder inside `--checkpoint-dir`. DCP unpickles checkpoint metadata, so a marker pointing
elsewhere would let whoever wrote it choose the code a resumed run executes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paraplan.executor.checkpoint import LATEST, latest_checkpoint


def test_marker_inside_the_folder(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None  # no marker: start afresh
    (tmp_path / "step-12").mkdir()
    (tmp_path / LATEST).write_text("step-12\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-12"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A checkpoint-looking folder outside the checkpoint dir."""
    elsewhere = tmp_path / "elsewhere" / "step-3"
    elsewhere.mkdir(parents=True)
    return elsewhere


@pytest.mark.parametrize(
    ("marker", "needle"),
    [
        ("../elsewhere/step-3", "not a step-<n> folder"),
        ("{outside}", "not a step-<n> folder"),  # an absolute path
        ("step-3/../../elsewhere/step-3", "not a step-<n> folder"),
        ("", "not a step-<n> folder"),
        ("step-1\nstep-2", "not a step-<n> folder"),
        ("x" * 1000, "over the limit of 256 bytes"),
    ],
    ids=["parent", "absolute", "dot-dot", "empty", "two-lines", "huge"],
)
def test_marker_that_leaves_the_folder(
    tmp_path: Path, outside: Path, marker: str, needle: str
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LATEST).write_text(marker.replace("{outside}", str(outside)))
    with pytest.raises(ValueError, match=needle.replace("<", ".").replace(">", ".")) as err:
        latest_checkpoint(ckpt)
    assert str(ckpt / LATEST) in str(err.value)


def test_step_folder_linked_outside(tmp_path: Path, outside: Path) -> None:
    """`step-3` itself a symbolic link to a folder elsewhere."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-3").symlink_to(outside, target_is_directory=True)
    (ckpt / LATEST).write_text("step-3\n")
    with pytest.raises(ValueError, match="outside"):
        latest_checkpoint(ckpt)


def test_marker_itself_not_a_file(tmp_path: Path) -> None:
    (tmp_path / LATEST).mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        latest_checkpoint(tmp_path)
    os.rmdir(tmp_path / LATEST)
    (tmp_path / LATEST).symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        latest_checkpoint(tmp_path)
