"""Traced profiles cached on disk, so planning a Hugging Face preset twice traces it once.

An entry is the profile JSON (`planner/profile_io.py`) under a digest of everything the trace
depends on: the model config (a preset's dict, or the config file's bytes), the sequence length
and dtype, the torch and transformers versions (read from package metadata: no import), the
profile schema version and the profiler's own source. Each entry is two lines: a header that
records those parts (`cache_key`) and the SHA-256 of the second line, the profile JSON as
`store` wrote it from a validated profile. It is used only when the parts, the digest and its
profile's sequence length match the trace asked for, and then built without the schema walk
(`profile_from_dict(trusted=True)`: 25 s of DeepSeek-V3's 60 MB profile when every block
was traced; 1.9 MB since the trace stops at the final run of identical blocks). An entry
that does not load or does not match (corrupt, truncated, edited, another schema, another
key, the one-document format before 2026-11-27) is ignored and rewritten; writes are atomic
(temporary file, then rename).

Where: `planner/user_cache.cache_dir` (`$PARAPLAN_CACHE_DIR`, else `$XDG_CACHE_HOME/paraplan`,
else `~/.cache/paraplan`); `PARAPLAN_NO_CACHE=1` turns it off. Nothing happens at import time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from .planner.hf_presets import HF_PRESETS
from .planner.model import ModelProfile
from .planner.outputs import write_atomic
from .planner.profile_io import PROFILE_SCHEMA_VERSION, profile_from_dict, profile_to_dict
from .planner.user_cache import cache_dir


@cache
def _profiler_digest() -> str:
    """Digest of the profiler's source: a changed tracer never serves old entries."""
    h = hashlib.sha256()
    for path in profiler_sources():
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def profiler_sources() -> list[Path]:
    """The profiler package's modules, and the executor's model adapters it traces (the
    profile is of the module the executor runs), found without importing either (nor torch):
    the packages map to the repository's `profiler/` and `executor/` folders in a source
    checkout, to `paraplan/profiler/` and `paraplan/executor/` when installed. Until
    2026-11-26 this looked beside this file only, found nothing in a checkout, and so never
    noticed a changed tracer."""
    found: list[Path] = []
    for package, patterns in (
        ("paraplan.profiler", ("*.py",)),
        ("paraplan.executor", ("chain.py", "convert.py", "models/*.py")),
    ):
        spec = find_spec(package)
        folders = spec.submodule_search_locations if spec is not None else None
        if not folders:
            raise RuntimeError(f"the {package} package is not installed; reinstall paraplan")
        folder = Path(next(iter(folders)))
        found += sorted(p for pattern in patterns for p in folder.glob(pattern))
    return found


def _version(package: str) -> str:
    from importlib import metadata  # on first use: it imports email, zipfile, csv (~50 ms)

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _key_parts(model: str, seq_len: int | None, precision: str) -> dict[str, object]:
    """Everything a trace of `model` depends on."""
    if model.lower() in HF_PRESETS:
        config = json.dumps(HF_PRESETS[model.lower()], sort_keys=True)
    else:
        config = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    parts = {
        "config": config,
        "seq_len": seq_len,
        "precision": precision,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "schema": PROFILE_SCHEMA_VERSION,
        "profiler": _profiler_digest(),
    }
    return parts


def cache_key(model: str, *, seq_len: int | None, precision: str) -> str:
    """The digest an entry for this trace is stored under."""
    parts = _key_parts(model, seq_len, precision)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _entry(model: str, seq_len: int | None, precision: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    return folder / f"{cache_key(model, seq_len=seq_len, precision=precision)}.json"


def lookup(model: str, *, seq_len: int | None, precision: str) -> ModelProfile | None:
    """The cached profile of this trace, or None (absent, off, or not a valid profile)."""
    path = _entry(model, seq_len, precision)
    if path is None:
        return None
    try:
        entry = read_entry(path)
        if entry.cache_key != _key_parts(model, seq_len, precision):
            return None  # written for another trace (or by hand): trace again
        if not entry.intact:
            return None  # edited or damaged since `store` wrote it
        profile = profile_from_dict(json.loads(entry.body), trusted=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or not a valid profile: trace again
    if seq_len is not None and profile.seq_len != seq_len:
        return None
    return profile


def store(model: str, profile: ModelProfile, *, seq_len: int | None, precision: str) -> None:
    """Keep `profile` for the next identical trace (silently skipped if not writable)."""
    path = _entry(model, seq_len, precision)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(profile_to_dict(profile))
        write_atomic(path, CacheEntry.of(_key_parts(model, seq_len, precision), body).text())
    except (OSError, ValueError):
        pass  # a read-only home still plans, uncached


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheEntry:
    """One cache file: a header line (the trace's key parts and the body's SHA-256), then the
    body, the profile JSON as `store` wrote it."""

    cache_key: object
    """What the trace depends on (`_key_parts`)."""
    sha256: str
    """Hex digest of `body` when it was written."""
    body: str
    """The profile JSON text."""

    @classmethod
    def of(cls, cache_key: object, body: str) -> CacheEntry:
        """An entry for `body`, with its digest."""
        return cls(cache_key=cache_key, sha256=hashlib.sha256(body.encode()).hexdigest(), body=body)

    @property
    def intact(self) -> bool:
        """Whether the body is what its digest was taken of."""
        return self.sha256 == hashlib.sha256(self.body.encode()).hexdigest()

    def text(self) -> str:
        """The file's text."""
        return json.dumps({"cache_key": self.cache_key, "sha256": self.sha256}) + "\n" + self.body


def read_entry(path: Path) -> CacheEntry:
    """The entry in `path`; ValueError when it is not two lines with a JSON object first."""
    header, newline, body = path.read_text(encoding="utf-8").partition("\n")
    parsed = json.loads(header)
    if not newline or not isinstance(parsed, dict):
        raise ValueError(f"{path}: not a cache entry")
    key, digest = parsed.get("cache_key"), str(parsed.get("sha256"))
    return CacheEntry(cache_key=key, sha256=digest, body=body)
