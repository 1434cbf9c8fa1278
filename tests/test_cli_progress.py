"""Issue 16's progress bars: `checkpoint`, `plan --from-config` and `run` draw progress on a
terminal's stderr, and nothing under --no-progress or when stderr is not a terminal."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from tqdm import tqdm

from paraplan.cli import main
from paraplan.cli.common import closing_callback
from paraplan.cli.run import PROGRESS_ENV

SPEC = "gpt:layers=4,hidden=256,heads=4,vocab=1024,seq=128"
CHECKPOINT = ["checkpoint", "--model", SPEC, "--budget", "1GiB"]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (tqdm draws on it)."""

    def isatty(self) -> bool:
        return True


def on_terminal(argv: list[str]) -> tuple[int, str]:
    """`paraplan ARGV` with stderr a terminal: the exit status and what it drew there. (Set in
    the test's body: pytest's own capture replaces sys.stderr again after a fixture's setup.)"""
    stderr = Terminal()
    with redirect_stderr(stderr):
        rc = main(argv)
    return rc, stderr.getvalue()


def test_checkpoint_draws_its_steps_on_a_terminal() -> None:
    rc, drawn = on_terminal(CHECKPOINT)
    assert rc == 0
    assert "checkpoint:" in drawn and "/3" in drawn  # model, DP, replays
    assert drawn.endswith("\r")  # erased when done (leave=False)


def test_checkpoint_ilp_has_two_more_steps() -> None:
    rc, drawn = on_terminal([*CHECKPOINT, "--solver", "ilp"])
    assert rc == 0 and "/5" in drawn


def test_no_progress_draws_nothing() -> None:
    assert on_terminal([*CHECKPOINT, "--no-progress"]) == (0, "")


def test_no_bar_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(CHECKPOINT) == 0
    assert capsys.readouterr().err == ""


def test_plan_from_config_draws_the_search(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}')
    argv = ["plan", "--from-config", str(config), "--model", SPEC, "--cluster", "8xh100"]
    rc, drawn = on_terminal(argv)
    assert rc == 0 and "searching:" in drawn
    assert on_terminal([*argv, "--no-progress"]) == (0, "")


def test_closing_callback_erases_the_bar_when_done() -> None:
    out = Terminal()
    with tqdm(total=100, file=out, leave=False) as bar:
        follow = closing_callback(bar)
        assert follow is not None
        follow(0.5)
        assert bar.n == 50 and not bar.disable
        follow(1.0)
        assert bar.disable  # closed: what the command prints next starts on a clean line
    with tqdm(total=100, file=out, disable=True) as off:
        assert closing_callback(off) is None


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """`run_plan` replaced: records the PARAPLAN_PROGRESS the ranks would inherit."""
    seen: list[str | None] = []

    def fake_run_plan(plan: str, script: str, script_args: list[str]) -> int:
        seen.append(os.environ.get(PROGRESS_ENV))
        return 0

    monkeypatch.setattr("paraplan.executor.launch.run_plan", fake_run_plan)
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    return seen


def test_run_announces_the_launch_and_lets_rank_0_draw(launches: list[str | None]) -> None:
    rc, drawn = on_terminal(["run", "p.json", "--", "train.py", "--steps", "5"])
    assert rc == 0 and launches == ["1"]
    assert "paraplan: launching train.py under torchrun" in drawn
    assert PROGRESS_ENV not in os.environ  # this process's environment is left as it was


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--no-progress", "p.json", "--", "train.py"],
        ["run", "p.json", "--no-progress", "--", "train.py"],
    ],
)
def test_run_no_progress(argv: list[str], launches: list[str | None]) -> None:
    assert on_terminal(argv) == (0, "")
    assert launches == ["0"]


def test_run_off_a_terminal_is_quiet(
    capsys: pytest.CaptureFixture[str], launches: list[str | None]
) -> None:
    assert main(["run", "p.json", "--", "train.py", "--no-progress"]) == 0
    assert launches == ["0"]  # the script's own --no-progress is the script's
    assert capsys.readouterr().err == ""


def test_run_refuses_an_unknown_option_before_the_script() -> None:
    rc, drawn = on_terminal(["run", "p.json", "--fast", "--", "train.py"])
    assert rc == 2 and "--fast: not an option of paraplan run" in drawn


TINY_HF = str(Path(__file__).resolve().parents[1] / "examples" / "configs" / "gpt2-tiny.json")
"""A Hugging Face config small enough to trace in a moment (torch needed)."""


def test_profile_draws_the_import_and_the_trace() -> None:
    pytest.importorskip("transformers")
    argv = ["profile", "--model", TINY_HF, "--seq-len", "64"]
    rc, drawn = on_terminal(argv)
    assert rc == 0 and "profile:" in drawn and "/2" in drawn and "importing torch" in drawn
    assert on_terminal([*argv, "--no-progress"]) == (0, "")


def test_plan_draws_the_trace_of_a_traced_model_only() -> None:
    pytest.importorskip("transformers")
    argv = ["plan", "--cluster", "2xcpu", "--global-batch", "8", "--seq-len", "64"]
    rc, drawn = on_terminal([*argv, "--model", TINY_HF])
    assert rc == 0 and "model:" in drawn and "searching:" in drawn
    rc, drawn = on_terminal([*argv, "--model", SPEC])  # an analytic spec: nothing to trace
    assert rc == 0 and "model:" not in drawn and "searching:" in drawn
    assert on_terminal([*argv, "--model", TINY_HF, "--no-progress"]) == (0, "")
