"""JSON schema of the plan, generated from the `Plan` dataclasses (docs/plan.schema.json is
this module's output; a test checks they agree). `python -m paraplan.planner.schema` prints it.

Everything comes from the types: enum fields list their enum's values, field docstrings
become descriptions, field metadata adds bounds. One rule comes from the naming convention
(units in names): a number whose name ends in `_bytes` or `_s` is a size or a duration and
may not be negative."""

from __future__ import annotations

import json
import typing
from functools import cache

from .jsonio import object_schema
from .plan import SCHEMA_VERSION, Plan

UNIT_SUFFIXES = ("_bytes", "_s")
"""Number fields with these name endings hold bytes or seconds: minimum 0."""


@cache
def plan_schema() -> dict[str, typing.Any]:
    """The plan JSON schema (draft 2020-12)."""
    schema = object_schema(Plan)
    schema["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    _non_negative_units(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/plan.schema.json",
        "title": "paraplan plan",
        **schema,
    }


def _non_negative_units(schema: dict[str, typing.Any]) -> None:
    """Give every byte and second figure (by its name's unit) a minimum of 0, in place."""
    for name, prop in schema.get("properties", {}).items():
        unit = name.endswith(UNIT_SUFFIXES) and prop.get("type") == "number"
        if unit and "minimum" not in prop and "exclusiveMinimum" not in prop:
            prop["minimum"] = 0
        _non_negative_units(prop)
        if isinstance(prop.get("items"), dict):
            _non_negative_units(prop["items"])


if __name__ == "__main__":
    print(json.dumps(plan_schema(), indent=2))
