"""Typed values <-> JSON: frozen dataclasses to dicts and back, JSON schemas generated from
the same dataclasses (field docstrings become descriptions) and strict validation. Plans and
profiles both go through here; files are read by `inputs` and written by `outputs`
(`write_atomic`, kept importable from here)."""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import os
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from functools import cache

from . import inputs
from .inputs import json_path, non_finite
from .outputs import write_atomic

_MAX_SHOWN = 300
"""Characters of a validation message shown (it quotes the bad value, which may be huge)."""
Overrides = dict[str, dict[str, typing.Any]]
"""Per field name, schema keywords that replace the generated type (e.g. an enum)."""


def to_json(value: typing.Any) -> typing.Any:
    """Dataclasses to dicts (their constructor's fields: derived `init=False` ones, such as
    an index built in `__post_init__`, are left out), tuples to lists, enums to values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value) if f.init}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def from_json(cls: typing.Any, data: typing.Any) -> typing.Any:
    """The inverse of `to_json` for an already validated document."""
    if is_dataclass(cls):
        build = typing.cast(typing.Any, cls)
        hints = _type_hints(build)
        return build(
            **{f.name: from_json(hints[f.name], data[f.name]) for f in fields(cls) if f.init}
        )
    origin = typing.get_origin(cls)
    if origin is tuple:
        item = typing.get_args(cls)[0]
        return tuple(from_json(item, v) for v in data)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        (inner,) = [a for a in typing.get_args(cls) if a is not type(None)]
        return from_json(inner, data)
    if isinstance(cls, type) and issubclass(cls, Enum):
        return cls(data)
    if cls is float:
        return float(data)
    return data


@cache
def _type_hints(cls: typing.Any) -> dict[str, typing.Any]:
    """`typing.get_type_hints`, once per class (it evaluates every annotation each call)."""
    return typing.get_type_hints(cls)


def type_schema(tp: typing.Any, name: str, overrides: Overrides) -> dict[str, typing.Any]:
    """JSON schema of a field type."""
    if name in overrides:
        return dict(overrides[name])
    if is_dataclass(tp):
        return object_schema(tp, overrides)
    origin = typing.get_origin(tp)
    if origin is tuple:
        return {"type": "array", "items": type_schema(typing.get_args(tp)[0], "", overrides)}
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return {"anyOf": [type_schema(inner, name, overrides), {"type": "null"}]}
    if isinstance(tp, type) and issubclass(tp, Enum):
        return {"enum": [e.value for e in tp]}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no schema for {tp!r}")  # pragma: no cover - a new field type


def object_schema(cls: typing.Any, overrides: Overrides | None = None) -> dict[str, typing.Any]:
    """Strict object schema of a dataclass: every field required, no other key allowed."""
    overrides = overrides or {}
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    props = {}
    for f in fields(cls):
        prop = type_schema(hints[f.name], f.name, overrides)
        prop |= {k: v for k, v in f.metadata.items() if k != "doc"}  # extra schema keywords
        doc = f.metadata.get("doc") or docs.get(f.name)
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


@cache
def field_docs(cls: typing.Any) -> dict[str, str]:
    """Field docstrings (the string literal after each field) read from the class source."""
    tree = ast.parse(inspect.getsource(cls).strip())
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
            docs[node.target.id] = " ".join(nxt.value.value.split())  # one line
    return docs


def validate(
    data: typing.Any, schema: dict[str, typing.Any], what: str, fix: str = "fix the value"
) -> None:
    """Raise ValueError naming the first problem (its JSON path, the rule), `fix` and where the
    format is documented. Numbers must be finite: Python's json reads NaN and Infinity, which
    JSON does not have."""
    import jsonschema

    bad = non_finite(data)
    if bad is not None:
        where, value = bad
        raise ValueError(
            f"invalid {what} at {where}: {value!r} is not a finite number (NaN and Infinity are "
            f"not valid JSON); {fix} (the format is {schema_doc(schema)})"
        )
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = json_path(err.absolute_path)
        problem = (
            err.message if len(err.message) <= _MAX_SHOWN else err.message[:_MAX_SHOWN] + "..."
        )
        raise ValueError(
            f"invalid {what} at {where}: {problem}; {fix} (the format is {schema_doc(schema)})"
        )


def schema_doc(schema: dict[str, typing.Any]) -> str:
    """Where a schema is documented."""
    return "docs/" + str(schema.get("$id", "the schema")).rsplit("/", 1)[-1]


def dumps_finite(doc: typing.Any, what: str, *, indent: int = 2) -> str:
    """`doc` as JSON text and a newline; ValueError naming the first NaN or infinite number
    (JSON has none: Python would write a bare NaN that no other reader accepts)."""
    bad = non_finite(doc)
    if bad is not None:
        raise ValueError(
            f"the {what} holds {bad[1]!r} at {bad[0]}, which JSON cannot hold; nothing was "
            "written (an input figure out of range, or a paraplan bug: please report it)"
        )
    return json.dumps(doc, indent=indent, allow_nan=False) + "\n"


def read_json(path: str | os.PathLike[str], what: str, hint: str) -> typing.Any:
    """Parse a JSON file through the input layer (`planner.inputs`: size, depth, UTF-8, finite
    numbers, no duplicate keys); any problem is a ValueError naming the path."""
    return inputs.read_json(path, what=f"{what} file", hint=hint)


__all__ = [
    "MISSING",
    "dumps_finite",
    "from_json",
    "non_finite",
    "object_schema",
    "read_json",
    "to_json",
    "validate",
    "write_atomic",
]
