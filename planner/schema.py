"""JSON schema of the plan, generated from the `Plan` dataclasses (docs/plan.schema.json is
this module's output; a test checks they agree). `python -m paraplan.planner.schema` prints it."""

from __future__ import annotations

import json
import typing
from functools import cache

from .jsonio import object_schema, validate
from .plan import SCHEMA_VERSION, Plan

_ENUMS = {
    "schedule": ["none", "gpipe", "1f1b", "interleaved_1f1b"],
    "recompute": ["none", "selective", "full"],
    "precision": ["fp32", "bf16", "fp16"],
    "optimizer": ["adamw", "sgd", "adafactor", "adam8bit"],
}
_AXES = ["pp", "dp", "cp", "tp"]


@cache
def plan_schema() -> dict[str, typing.Any]:
    """The plan JSON schema (draft 2020-12)."""
    overrides: dict[str, dict[str, typing.Any]] = {n: {"enum": v} for n, v in _ENUMS.items()}
    axes = {"type": "array", "items": {"enum": _AXES}}
    overrides |= {"axis_order": axes, "mesh_axis_order": axes}
    schema = object_schema(Plan, overrides)
    schema["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    policies = {"enum": [*_ENUMS["recompute"], "per_layer"]}
    schema["properties"]["recompute_policy"] |= policies
    schema["properties"]["runners_up"]["items"]["properties"]["recompute"] |= policies
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/plan.schema.json",
        "title": "paraplan plan",
        **schema,
    }


def validate_plan_dict(data: typing.Any) -> None:
    """Raise ValueError naming the first problem (its JSON path, the rule, the fix)."""
    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ValueError(
            f"schema_version {data.get('schema_version')!r} is not supported (this paraplan "
            f"reads version {SCHEMA_VERSION}); regenerate the plan with this version"
        )
    validate(data, plan_schema(), "plan")


if __name__ == "__main__":
    print(json.dumps(plan_schema(), indent=2))
