"""Input files (issue 14): every model, cluster, plan and profile file goes through one input
layer. A hostile file (deeply nested, unreadable, not UTF-8, a FIFO or device, too big, a
"billion laughs" YAML, duplicate keys, NaN) ends in one line naming the file and exit 2, fast,
through the CLI's `main` in-process."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import paraplan
from paraplan.planner.inputs import MAX_DEPTH, MAX_INPUT_BYTES, json_depth, parse_json, parse_yaml
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.plan_io import save_plan
from paraplan.planner.profile_io import save_profile

from .robust_helpers import TINY, Unprivileged, refused

CLUSTER_YAML = "accelerator: cpu\nnodes: 1\ngpus_per_node: 2\n"


@pytest.fixture(scope="module")
def good_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A valid file of each kind, written by paraplan itself."""
    folder = tmp_path_factory.mktemp("good")
    plan = paraplan.plan(TINY, "2xcpu", global_batch=4, top_k=1).plan
    save_plan(plan, folder / "plan.json")
    save_profile(PRESETS["gpt2"].to_profile(128), folder / "profile.json")
    (folder / "model.json").write_text(
        json.dumps({"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq": 64})
    )
    (folder / "cluster.yaml").write_text(CLUSTER_YAML)
    return {
        "plan": folder / "plan.json",
        "profile": folder / "profile.json",
        "model": folder / "model.json",
        "cluster": folder / "cluster.yaml",
    }


def _argv(kind: str, path: Path | str) -> list[str]:
    """A command line that reads `path` as a file of `kind`."""
    path = str(path)
    plan = ["plan", "--global-batch", "4", "--no-progress"]
    if kind == "model":
        return [*plan, "--model", path, "--cluster", "2xcpu"]
    if kind == "cluster":
        return [*plan, "--model", TINY, "--cluster", path]
    if kind == "profile":
        return [*plan, "--profile", path, "--cluster", "2xcpu"]
    return ["show", path]


KINDS = ("model", "cluster", "plan", "profile")


def test_good_files_are_read(
    capsys: pytest.CaptureFixture[str], good_files: dict[str, Path]
) -> None:
    """The same command lines succeed on valid files: the refusals below are the files'."""
    from .robust_helpers import run_cli

    for kind in KINDS:
        assert run_cli(_argv(kind, good_files[kind])) == 0, (kind, capsys.readouterr())
    capsys.readouterr()


@pytest.mark.parametrize(("kind", "syntax"), [*((k, "json") for k in KINDS), ("cluster", "yaml")])
def test_deep_nesting_is_refused_before_parsing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, syntax: str
) -> None:
    """100,000 levels made Python's parsers raise RecursionError (a traceback)."""
    path = tmp_path / f"deep.{syntax}"
    path.write_text("[" * 100_000 + "]" * 100_000 if syntax == "json" else "{a: " * 100_000)
    refused(capsys, _argv(kind, path), str(path), "levels deep", f"limit of {MAX_DEPTH}")


@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, good_files: dict[str, Path], kind: str
) -> None:
    """A file without read permission (PermissionError was a traceback)."""
    path = tmp_path / good_files[kind].name
    path.write_bytes(good_files[kind].read_bytes())
    path.chmod(0)
    with Unprivileged(tmp_path):
        refused(capsys, _argv(kind, path), str(path), "permission denied")


@pytest.mark.parametrize("kind", KINDS)
def test_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("x.yaml" if kind == "cluster" else "x.json")
    path.write_bytes(b'{"name": "caf\xe9"}')  # Latin-1
    refused(capsys, _argv(kind, path), str(path), "not UTF-8", "0xe9", "offset 13")


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (opening a FIFO for reading blocks until a writer comes)."""

    def hang(*_: object) -> None:
        raise AssertionError(f"still running after {seconds} s: blocked on the file?")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("node", ["fifo", "folder", "/dev/zero"])
def test_not_a_regular_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, node: str
) -> None:
    path = tmp_path / ("x.yaml" if kind == "cluster" else "x.json")
    if node == "fifo":
        os.mkfifo(path)
    elif node == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # endless: reading it would never stop
    with _deadline(10):
        refused(capsys, _argv(kind, path), str(path), "not a regular file")


@pytest.mark.parametrize("kind", KINDS)
def test_too_big(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("x.yaml" if kind == "cluster" else "x.json")
    with path.open("wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: no disk used
    refused(
        capsys, _argv(kind, path), str(path), f"{MAX_INPUT_BYTES + 1:,} bytes", "over the limit"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("gone.yaml" if kind == "cluster" else "gone.json")
    refused(capsys, _argv(kind, path), str(path), "does not exist")


def test_long_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    """A --model string over 255 bytes (OSError from Path.is_file was a traceback)."""
    refused(capsys, _argv("model", "x" * 300), "not a known model")
    refused(capsys, _argv("model", "x" * 300 + ".json"), "File name too long")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"layers": 2, "layers": 3}', "appears twice"),
        ('{"layers": 1' + "0" * 5000 + "}", "longer than"),
        ('{"layers": NaN}', "not a finite number"),
        ('{"layers": 1e999}', "not a finite number"),
        ("[1, 2", "not valid JSON (line 1, column 6"),
    ],
    ids=["duplicate-key", "5000-digits", "nan", "1e999", "truncated"],
)
def test_bad_json_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "m.json"
    path.write_text(text)
    refused(capsys, _argv("model", path), str(path), needle)


_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
"""Nine levels of ten aliases each: 10^9 nodes once expanded, nine lines of text."""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (_LAUGHS, "expands to more than"),
        ("a: &a [*a]\n", "refers to a collection that contains it"),
        (CLUSTER_YAML + "nodes: 2\n", "appears twice"),
        (CLUSTER_YAML.replace("1", ".nan"), "not a finite number"),
        (CLUSTER_YAML + "calibration: {peak_flops: {bf16: .inf}}\n", "calibration.peak_flops.bf16"),
        ("!!python/object/apply:os.system [echo hi]", "not valid YAML"),
        ("accelerator: cpu\nnodes: [1\n", "not valid YAML"),
    ],
    ids=["billion-laughs", "self-alias", "duplicate-key", "nan", "inf", "python-tag", "truncated"],
)
def test_bad_yaml_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    refused(capsys, _argv("cluster", path), str(path), needle)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("n_embd", "abc", "n_embd='abc' must be a whole number"),
        ("vocab_size", 0, "vocab_size=0 is below the minimum of 1"),
        ("n_head", 0, "n_head=0 is below the minimum of 1"),
        ("n_layer", 10**12, "n_layer=1000000000000 is above the limit of 1,024"),
        ("n_positions", 10**12, "above the limit of 16,777,216 tokens"),
        ("n_embd", 1e30, "must be a whole number"),
        ("model_type", 5, "model_type=5"),
        # found by the fuzz suite: errors from inside transformers and the tracer
        ("n_embd", None, "n_embd=None must be a whole number"),
        ("layer_norm_epsilon", "x", "transformers refused the config"),
        ("activation_function", "abc", "could not build the model"),
        ("n_head", 3, "hidden size 64 is not a multiple of 3 attention heads"),
    ],
)
def test_bad_hugging_face_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str, value: object, needle: str
) -> None:
    """Sizes are checked before transformers sees them (a string or zero was a traceback from
    deep inside it, 1e12 layers a hang, 1e12 positions a failed 8 TB allocation); what only
    transformers can judge is refused by it, as one line (it imports torch: not timed)."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, key: value})
    )
    before_torch = key not in ("layer_norm_epsilon", "activation_function", "n_head")
    refused(capsys, _argv("model", path), str(path), needle, within_s=2.0 if before_torch else 120)


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth('{"a": "[[[[{{{{", "b": [[1]]}') == 3
    assert json_depth('["\\"[[[", [2]]') == 2
    assert parse_json('["[[[["]', origin="t", hint="h") == ["[[[["]


def test_yaml_numbers_are_yaml_1_2() -> None:
    """4.5e10 and 1e9 are numbers, as in JSON (PyYAML's YAML 1.1 reads them as strings)."""
    assert parse_yaml("a: 4.5e10\nb: 1e9\nc: '1e9'\n", origin="t", hint="h") == {
        "a": 4.5e10,
        "b": 1e9,
        "c": "1e9",
    }


def test_yaml_aliases_within_the_limit_are_read() -> None:
    """Anchors are fine (yaml.safe_dump writes them for shared objects): only the expanded
    size is limited."""
    data: Callable[[], object] = lambda: parse_yaml("a: &x {k: 1}\nb: *x\n", origin="t", hint="h")  # noqa: E731
    assert data() == {"a": {"k": 1}, "b": {"k": 1}}
