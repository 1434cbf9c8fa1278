"""Which of paraplan's JSON documents a parsed file is, so that a loader handed the wrong one
(a profile to `paraplan show`, a plan to `--profile`) says what it holds and which command
takes it, instead of a schema error about a field or a version that belongs to another kind."""

from __future__ import annotations

import typing
from enum import StrEnum


class Document(StrEnum):
    """A kind of JSON file paraplan writes, named as its messages name it."""

    PLAN = "plan"
    PROFILE = "model profile"
    SCHEDULE = "checkpoint schedule"
    RUN_REPORT = "run report"


_WRITER: dict[Document, str] = {
    Document.PLAN: "paraplan plan -o",
    Document.PROFILE: "paraplan profile -o",
    Document.SCHEDULE: "paraplan checkpoint -o",
    Document.RUN_REPORT: "paraplan run's training script (--report)",
}
_USE: dict[Document, str] = {
    Document.PLAN: "paraplan show, explain, run or export take it",
    Document.PROFILE: "plan it with paraplan plan --profile {path} --cluster ...",
    Document.SCHEDULE: "paraplan.executor.memory_schedule applies it to a module",
    Document.RUN_REPORT: "paraplan calibrate --from-run {path} takes it",
}


def kind_of(data: typing.Any) -> Document | None:
    """The kind of a parsed document by the top-level keys only its kind has, or None."""
    if not isinstance(data, dict):
        return None
    if "parallelism" in data and "predicted" in data:
        return Document.PLAN
    if "profile" in data and "schema_version" in data:
        return Document.PROFILE
    if "schedule" in data and "schema_version" in data:
        return Document.SCHEDULE
    if "step_time_s" in data and "predicted_step_time_s" in data:
        return Document.RUN_REPORT
    return None


def wrong_kind(data: typing.Any, expected: Document, path: str = "FILE") -> str | None:
    """The message for a document (read from `path`) of another kind than `expected` (None
    when it is not recognisably another kind: the loader's own checks then speak)."""
    kind = kind_of(data)
    if kind is None or kind == expected:
        return None
    use = _USE[kind].format(path=path)
    return (
        f"this is a {kind} (written by {_WRITER[kind]}), not a {expected}: {use}; "
        f"a {expected} is written by {_WRITER[expected]}"
    )
