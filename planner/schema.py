"""JSON schema of the plan, generated from the `Plan` dataclasses (docs/plan.schema.json is
this module's output; a test checks they agree). `python -m paraplan.planner.schema` prints it."""

from __future__ import annotations

import itertools
import json
import typing
from dataclasses import MISSING, fields, is_dataclass
from functools import cache

from .plan import SCHEMA_VERSION, Plan

_ENUMS = {
    "schedule": ["none", "gpipe", "1f1b", "interleaved_1f1b"],
    "recompute": ["none", "selective", "full"],
    "precision": ["fp32", "bf16", "fp16"],
    "optimizer": ["adamw", "sgd", "adafactor", "adam8bit"],
}
_AXES = ["pp", "dp", "cp", "tp"]


def _type_schema(tp: typing.Any, name: str) -> dict[str, typing.Any]:
    if is_dataclass(tp):
        return _object_schema(tp)
    if typing.get_origin(tp) is tuple:
        (item, _) = typing.get_args(tp)
        items = _type_schema(item, name)
        if name in ("axis_order", "mesh_axis_order"):
            items = {"enum": _AXES}
        return {"type": "array", "items": items}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"enum": _ENUMS[name]} if name in _ENUMS else {"type": "string"}
    raise TypeError(f"no schema for {tp!r}")  # pragma: no cover - a new field type


def _object_schema(cls: typing.Any) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    props = {}
    for f in fields(cls):
        prop = _type_schema(hints[f.name], f.name)
        for key in ("minimum", "maximum"):
            if key in f.metadata:
                prop[key] = f.metadata[key]
        doc = f.metadata.get("doc")
        if doc is None and f.default is MISSING:
            doc = _field_docs(cls).get(f.name)
        if doc:
            prop["description"] = doc
        props[f.name] = prop
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": props,
        "required": [f.name for f in fields(cls)],
        "additionalProperties": False,
    }


def _field_docs(cls: typing.Any) -> dict[str, str]:
    """Field docstrings (the string literal after each field) read from the source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


@cache
def plan_schema() -> dict[str, typing.Any]:
    """The plan JSON schema (draft 2020-12)."""
    schema = _object_schema(Plan)
    schema["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/plan.schema.json",
        "title": "paraplan plan",
        **schema,
    }


def validate_plan_dict(data: typing.Any) -> None:
    """Raise ValueError naming the first problem (its JSON path, the rule, the fix)."""
    import jsonschema

    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ValueError(
            f"schema_version {data.get('schema_version')!r} is not supported (this paraplan "
            f"reads version {SCHEMA_VERSION}); regenerate the plan with this version"
        )
    validator = jsonschema.Draft202012Validator(plan_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ValueError(
            f"invalid plan at {where}: {err.message}; the format is docs/plan.schema.json"
        )


if __name__ == "__main__":
    print(json.dumps(plan_schema(), indent=2))
