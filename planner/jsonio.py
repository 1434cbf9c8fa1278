"""Typed values <-> JSON: frozen dataclasses to dicts and back, JSON schemas generated from
the same dataclasses (field docstrings become descriptions), strict validation, and atomic
writes. Plans and profiles both go through here."""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import math
import os
import secrets
import stat
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
        raise ValueError(
            f"invalid {what} at {where}: {err.message}; {fix} (the format is {schema_doc(schema)})"
        )


def json_path(parts: typing.Iterable[str | int]) -> str:
    """A location in a document as `a.b.0.c` (`(top level)` for the document itself)."""
    return ".".join(str(p) for p in parts) or "(top level)"


def non_finite(data: typing.Any, at: tuple[str | int, ...] = ()) -> tuple[str, float] | None:
    """(JSON path, value) of the first NaN or infinite number in a parsed document, or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return json_path(at), data
    items: typing.Iterable[tuple[str | int, typing.Any]] = ()
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    for key, value in items:
        found = non_finite(value, (*at, key))
        if found is not None:
            return found
    return None


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
    """Write `text` (UTF-8) to `path` so that a reader sees the old file or the new one, never
    half of one: the text goes to a temporary file with a unique name in the target's folder,
    which is then renamed over the target. The new file has the permissions of any new file
    (0666 less the umask). Any failure removes the temporary file and leaves the target as it
    was.

    A symbolic link is written through: the file it points to (at the end of a chain of links)
    is replaced and the link stays. A path that exists and is not a regular file (a folder, a
    FIFO, a device, a socket) is refused with ValueError and left untouched. This is the
    project's only atomic writer: plans, profiles, clusters, reports and checkpoints use it."""
    target = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise ValueError(
            f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist; create it "
            "first or choose another path"
        )
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(
            f"cannot write {str(path)!r}: it exists and is not a regular file (a folder, FIFO "
            "or device is never replaced); remove it or choose another path"
        )
    fd, tmp = _create_temp(folder, target.name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_TEMP_TRIES = 100
"""Random names tried before giving up (48 random bits each: a clash is already unlikely)."""


def _create_temp(folder: Path, name: str) -> tuple[int, Path]:
    """A new file `.<name>.<random>.tmp` in `folder`, open for writing. Unlike
    `tempfile.mkstemp` (mode 0600), it is created with mode 0666 and the kernel applies the
    umask, so the file ends with normal permissions without reading the process umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_TRIES):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name!r} in {str(folder)!r}")


__all__ = [
    "MISSING",
    "from_json",
    "non_finite",
    "object_schema",
    "read_json",
    "to_json",
    "validate",
    "write_atomic",
]
