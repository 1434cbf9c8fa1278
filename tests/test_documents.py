"""A paraplan file handed to the command for another kind (a profile to `show`, a plan to
`plan --profile`, a checkpoint schedule to `explain`) is refused with exit 2 and one line that
names what the file is and which command takes it, not a schema-version error about a
different document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan
from paraplan.api import model_profile
from paraplan.cli import main
from paraplan.executor.report import make_report
from paraplan.planner.documents import Document, kind_of, wrong_kind
from paraplan.planner.plan_io import load_plan, save_plan
from paraplan.planner.profile_io import load_profile, save_profile
from paraplan.planner.remat_schedule import load_schedule

SPEC = "gpt:layers=2,hidden=64,heads=2,vocab=256,seq=32"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[Document, Path]:
    """One real file of each kind, written by paraplan's own writers."""
    root = tmp_path_factory.mktemp("documents")
    plan = paraplan.plan(SPEC, "2xcpu", global_batch=4).plan
    out = {kind: root / f"{kind.name.lower()}.json" for kind in Document}
    save_plan(plan, out[Document.PLAN])
    save_profile(model_profile(SPEC, seq_len=None, source="spec"), out[Document.PROFILE])
    assert (
        main(
            [
                "checkpoint",
                "--model",
                SPEC,
                "--budget",
                "1GiB",
                "--gpu",
                "cpu",
                "-o",
                str(out[Document.SCHEDULE]),
                "--no-progress",
            ]
        )
        == 0
    )
    report = make_report(
        plan,
        step_times_s=[0.2, 0.21],
        warmup_steps=2,
        memory_bytes=[1e8, 1e8],
        memory_source="test",
        device="cpu",
        first_step=0,
        losses=[3.0, 2.9],
    )
    report.save(out[Document.RUN_REPORT])
    return out


def test_each_file_is_recognised_as_its_own_kind(files: dict[Document, Path]) -> None:
    for kind, path in files.items():
        data = json.loads(path.read_text())
        assert kind_of(data) == kind
        assert wrong_kind(data, kind) is None
        for other in Document:
            if other != kind:
                said = wrong_kind(data, other, str(path))
                assert said is not None and f"this is a {kind}" in said and f"not a {other}" in said
    assert kind_of({"schema_version": 6}) is None and kind_of([1, 2]) is None


def test_the_loaders_name_the_kind_they_were_given(files: dict[Document, Path]) -> None:
    with pytest.raises(ValueError, match=r"this is a model profile .* plan it with paraplan plan"):
        load_plan(files[Document.PROFILE])
    with pytest.raises(ValueError, match=r"this is a plan .*paraplan show, explain"):
        load_profile(files[Document.PLAN])
    with pytest.raises(ValueError, match="this is a plan"):
        load_schedule(files[Document.PLAN])
    with pytest.raises(ValueError, match=r"this is a run report .*calibrate --from-run"):
        load_plan(files[Document.RUN_REPORT])
    # each still loads as what it is
    assert load_plan(files[Document.PLAN]).model.name
    assert load_profile(files[Document.PROFILE]).layers
    assert load_schedule(files[Document.SCHEDULE]).steps


@pytest.mark.parametrize(
    ("argv", "given", "expected"),
    [
        (["show"], Document.PROFILE, "this is a model profile (written by paraplan profile -o)"),
        (["explain"], Document.SCHEDULE, "this is a checkpoint schedule"),
        (
            ["plan", "--cluster", "8xh100", "--global-batch", "8", "--profile"],
            Document.PLAN,
            "this is a plan (written by paraplan plan -o), not a model profile",
        ),
    ],
)
def test_the_commands_exit_2_with_one_line(
    files: dict[Document, Path],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    given: Document,
    expected: str,
) -> None:
    assert main([*argv, str(files[given])]) == 2
    err = capsys.readouterr().err
    assert expected in err and "schema_version" not in err
    assert len(err.strip().splitlines()) == 1
