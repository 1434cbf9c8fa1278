"""Typed values <-> JSON: frozen dataclasses to dicts and back, JSON schemas generated from
the same dataclasses (field docstrings become descriptions), strict validation, and atomic
writes. Plans and profiles both go through here."""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import os
import tempfile
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from functools import cache
from pathlib import Path

Overrides = dict[str, dict[str, typing.Any]]
"""Per field name, schema keywords that replace the generated type (e.g. an enum)."""


def to_json(value: typing.Any) -> typing.Any:
    """Dataclasses to dicts, tuples to lists, enums to their values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def from_json(cls: typing.Any, data: typing.Any) -> typing.Any:
    """The inverse of `to_json` for an already validated document."""
    if is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        build = typing.cast(typing.Any, cls)
        return build(**{f.name: from_json(hints[f.name], data[f.name]) for f in fields(cls)})
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
        for key in ("minimum", "maximum"):
            if key in f.metadata:
                prop[key] = f.metadata[key]
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
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def validate(data: typing.Any, schema: dict[str, typing.Any], what: str) -> None:
    """Raise ValueError naming the first problem (its JSON path, the rule) and the format."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ValueError(
            f"invalid {what} at {where}: {err.message}; the format is {schema_doc(schema)}"
        )


def schema_doc(schema: dict[str, typing.Any]) -> str:
    """Where a schema is documented."""
    return "docs/" + str(schema.get("$id", "the schema")).rsplit("/", 1)[-1]


def read_json(path: str | os.PathLike[str], what: str, hint: str) -> typing.Any:
    """Parse a JSON file; a missing file or bad JSON is a ValueError naming the path."""
    source = Path(path)
    if not source.is_file():
        raise ValueError(f"{what} file {str(source)!r} does not exist; {hint}")
    try:
        return json.loads(source.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{what} file {str(source)!r} is not valid JSON (line {exc.lineno}, column "
            f"{exc.colno}: {exc.msg}); {hint}"
        ) from None


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write through a temporary file in the same folder and a rename: a reader never sees a
    half-written file, and a failed write leaves the old one."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"cannot write {str(target)!r}: folder {str(folder)!r} is missing")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["MISSING", "from_json", "object_schema", "read_json", "to_json", "validate",
           "write_atomic"]  # fmt: skip
