"""Profile JSON: the docs schema is the generated one; strict load; exact round trip."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from paraplan.planner.model_spec import PRESETS
from paraplan.planner.profile_io import (
    load_profile,
    profile_schema,
    profile_to_dict,
    save_profile,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "profile.schema.json"


def test_docs_schema_is_the_generated_one() -> None:
    on_disk = json.loads(DOCS.read_text())
    assert on_disk == profile_schema(), "docs/profile.schema.json is stale: run `make schema`"
    jsonschema.Draft202012Validator.check_schema(on_disk)


def test_spec_profile_round_trip(tmp_path: Path) -> None:
    prof = PRESETS["mixtral-8x7b"].to_profile(1024)
    path = tmp_path / "p.json"
    save_profile(prof, path)
    jsonschema.validate(json.loads(path.read_text()), json.loads(DOCS.read_text()))
    assert load_profile(path) == prof


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["profile"].update(extra=1), "extra"),
        (lambda d: d["profile"]["layers"][0].update(kind="stem"), "kind"),
        (lambda d: d["profile"]["layers"][1].pop("fwd_flops"), "fwd_flops"),
        (lambda d: d.update(schema_version=99), "schema_version"),
    ],
)
def test_strict_load(tmp_path: Path, mutate, needle: str) -> None:
    data = profile_to_dict(PRESETS["gpt2"].to_profile(128))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=needle):
        load_profile(path)
