"""Input files: the one door every model, cluster, plan, profile and calibration file comes in by.

Reading a file here means, in this order, each rule refused with a ValueError that names the
file, the rule and the fix (never a traceback, a hang or an unbounded allocation):

1. the path names an existing regular file (a folder, FIFO or device is refused: opening a
   FIFO for reading would block, and a device such as /dev/zero never ends);
2. it is at most `MAX_INPUT_BYTES` long (checked before reading, and again while reading);
3. it is UTF-8 text (a leading byte-order mark is allowed);
4. its nesting depth is at most `MAX_DEPTH`, checked on the text (JSON) or on the event stream
   (YAML) before a recursive parser or validator sees it; a YAML document may hold at most
   `MAX_YAML_NODES` nodes with its aliases expanded (a "billion laughs" file is refused);
5. it parses, with no key given twice in one object;
6. every number in it is finite (Python's json reads NaN and Infinity, and 1e999 as inf;
   YAML has .nan and .inf).

Strict keys and value ranges are the next layer's job: the schemas of plans and profiles, the
cluster and spec loaders, and `planner.limits` for the bounds on every count.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import typing
from pathlib import Path

MAX_INPUT_BYTES = 64 * 2**20
"""Largest input file read (64 MiB). A plan is tens of KiB; the largest profile the tracer
writes (llama3-405b with per-layer op graphs) is a few MiB."""
MAX_DEPTH = 64
"""Deepest nesting of lists and objects in an input document. The deepest format paraplan
reads (a profile's op graphs) nests 6 levels; Python's parsers and validators recurse once per
level and fail near 1,000."""
MAX_YAML_NODES = 1_000_000
"""Most YAML nodes a document may expand to, aliases counted at their full size."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def read_text(
    path: str | os.PathLike[str], *, what: str, hint: str, max_bytes: int = MAX_INPUT_BYTES
) -> str:
    """The text of a regular file of at most `max_bytes` bytes, decoded as UTF-8. `what` names
    the file's role in messages ("plan file"), `hint` says how to get a good one."""
    name = os.fspath(path)
    where = f"{what} {name!r}"
    if not name or "\x00" in name:
        raise ValueError(f"{what} {name!r}: not a path (empty, or a NUL byte in it); {hint}")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ValueError(f"{where} does not exist; {hint}") from None
    except PermissionError:
        raise ValueError(
            f"{where} cannot be read: permission denied; make it readable (chmod u+r) or copy it"
        ) from None
    except OSError as exc:
        raise ValueError(f"{where} cannot be opened: {exc.strerror}; {hint}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(
                f"{where} is not a regular file (a folder, FIFO or device is never read); {hint}"
            )
        if info.st_size > max_bytes:
            raise ValueError(_too_big(where, info.st_size, max_bytes))
        data = _read_at_most(fd, max_bytes + 1, where)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise ValueError(_too_big(where, len(data), max_bytes))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{where} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"(line {line}) is not valid UTF-8; save the file as UTF-8"
        ) from None


def _read_at_most(fd: int, limit: int, where: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            chunk = os.read(fd, min(1 << 20, limit - size))
        except OSError as exc:
            raise ValueError(f"{where} cannot be read: {exc.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _too_big(where: str, size: int, limit: int) -> str:
    return (
        f"{where} is {size:,} bytes, over the limit of {limit:,} bytes ({limit // 2**20} MiB) "
        "for an input file; is it the right file?"
    )


# ---- JSON -------------------------------------------------------------------------------------
def json_depth(text: str) -> int:
    """Deepest nesting of `[` and `{` in JSON text (brackets inside strings ignored), computed
    without recursion, in time linear in the text."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        depth += _DEPTH_STEP[char]
        deepest = max(deepest, depth)
    return deepest


def parse_json(text: str, *, origin: str, hint: str) -> typing.Any:
    """Parse JSON text under the depth, duplicate-key and finite-number rules; `origin` names
    the source in messages."""
    deepest = json_depth(text)
    if deepest > MAX_DEPTH:
        raise ValueError(_too_deep(origin, deepest, hint))
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{origin} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {hint}"
        ) from None
    except ValueError as exc:  # a duplicate key, or an integer of thousands of digits
        raise ValueError(f"{origin} is not valid JSON: {_parse_problem(exc)}; {hint}") from None
    _check_finite(data, origin, hint)
    return data


def _parse_problem(exc: ValueError) -> str:
    if "integer string conversion" in str(exc):  # Python's limit on int() of long text
        return f"a number is longer than {sys.get_int_max_str_digits():,} digits"
    return str(exc)


def _unique_keys(pairs: list[tuple[str, typing.Any]]) -> dict[str, typing.Any]:
    out: dict[str, typing.Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object: give it once")
        out[key] = value
    return out


def _too_deep(origin: str, depth: int, hint: str) -> str:
    return (
        f"{origin} nests {depth} levels deep, over the limit of {MAX_DEPTH} (no paraplan format "
        f"nests more than a few levels); {hint}"
    )


def read_json(path: str | os.PathLike[str], *, what: str, hint: str) -> typing.Any:
    """Read and parse a JSON file under every rule of this module."""
    text = read_text(path, what=what, hint=hint)
    return parse_json(text, origin=f"{what} {os.fspath(path)!r}", hint=hint)


# ---- YAML -------------------------------------------------------------------------------------
def parse_yaml(text: str, *, origin: str, hint: str) -> typing.Any:
    """Parse YAML text under the depth, size, duplicate-key and finite-number rules. Numbers
    follow YAML 1.2 (4.5e10 and 1e9 are floats, as in JSON), not PyYAML's YAML 1.1 (strings)."""
    import yaml  # deferred: only YAML files need it

    loader = _yaml_loader()
    try:
        _check_yaml_shape(yaml.parse(text, Loader=loader), origin, hint)
    except yaml.YAMLError as exc:
        raise ValueError(f"{origin} is not valid YAML: {_one_line(exc)}; {hint}") from None
    try:
        data = yaml.load(text, Loader=loader)  # a SafeLoader subclass: no Python objects
    except yaml.YAMLError as exc:
        raise ValueError(f"{origin} is not valid YAML: {_one_line(exc)}; {hint}") from None
    except ValueError as exc:  # a duplicate key, or an integer of thousands of digits
        raise ValueError(f"{origin} is not valid YAML: {_parse_problem(exc)}; {hint}") from None
    _check_finite(data, origin, hint)
    return data


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _check_yaml_shape(events: typing.Iterable[typing.Any], origin: str, hint: str) -> None:
    """Walk the parser's events (no recursion): depth and node count with aliases expanded."""
    import yaml

    open_sizes: list[list[typing.Any]] = []  # [anchor, nodes so far] per open collection
    anchored: dict[str, int] = {}
    top = 0

    def add(size: int) -> None:
        nonlocal top
        if open_sizes:
            open_sizes[-1][1] += size
            size = open_sizes[-1][1]
        else:
            top += size
            size = top
        if size > MAX_YAML_NODES:
            raise ValueError(
                f"{origin} expands to more than {MAX_YAML_NODES:,} nodes (anchors and aliases "
                f"counted in full); {hint}"
            )

    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            open_sizes.append([event.anchor, 1])
            if len(open_sizes) > MAX_DEPTH:
                raise ValueError(_too_deep(origin, len(open_sizes), hint))
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = open_sizes.pop()
            if anchor is not None:
                anchored[anchor] = size
            add(size)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchored[event.anchor] = 1
            add(1)
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_sizes):
                raise ValueError(
                    f"{origin}: alias *{event.anchor} refers to a collection that contains it (a "
                    f"document that never ends); {hint}"
                )
            add(anchored.get(str(event.anchor), 1))


def _yaml_loader() -> typing.Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2 floats and no key given twice in one mapping."""

        def construct_mapping(self, node: typing.Any, deep: bool = False) -> typing.Any:
            seen: set[typing.Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, typing.Hashable):
                    continue  # the base class refuses it, with its line
                if key in seen:
                    raise ValueError(
                        f"key {key!r} appears twice in one mapping (line "
                        f"{key_node.start_mark.line + 1}): give it once"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent ("4.5e+10").
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def read_yaml(path: str | os.PathLike[str], *, what: str, hint: str) -> typing.Any:
    """Read and parse a YAML file under every rule of this module."""
    text = read_text(path, what=what, hint=hint)
    return parse_yaml(text, origin=f"{what} {os.fspath(path)!r}", hint=hint)


def read_document(path: str | os.PathLike[str], *, what: str, hint: str) -> typing.Any:
    """A JSON file (suffix .json) or a YAML file (any other suffix, e.g. .yaml/.yml)."""
    if Path(path).suffix.lower() == ".json":
        return read_json(path, what=what, hint=hint)
    return read_yaml(path, what=what, hint=hint)


# ---- finite numbers ---------------------------------------------------------------------------
def json_path(parts: typing.Iterable[str | int]) -> str:
    """A location in a document as `a.b.0.c` (`(top level)` for the document itself)."""
    return ".".join(str(p) for p in parts) or "(top level)"


def non_finite(data: typing.Any, at: tuple[str | int, ...] = ()) -> tuple[str, float] | None:
    """(JSON path, value) of the first NaN or infinite number in a parsed document, or None.
    Recursive: call it on documents whose depth is already checked."""
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


def _check_finite(data: typing.Any, origin: str, hint: str) -> None:
    bad = non_finite(data)
    if bad is not None:
        where, value = bad
        raise ValueError(
            f"{origin} at {where}: {value!r} is not a finite number (NaN and Infinity are not "
            f"valid JSON, and 1e999 overflows); {hint}"
        )


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names an existing regular file (symlinks followed); False, never an
    error, for a name the system cannot look up (too long, a NUL byte, no permission)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
