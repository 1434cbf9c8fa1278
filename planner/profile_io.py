"""Profile JSON: `docs/profile.schema.json` (generated from `ModelProfile`), strict load
(unknown keys rejected), atomic save. `python -m paraplan.planner.profile_io` prints the
schema."""

from __future__ import annotations

import json
import os
import typing
from functools import cache

from . import limits
from .documents import Document, wrong_kind
from .jsonio import (
    dumps_finite,
    from_json,
    object_schema,
    read_json,
    to_json,
    validate,
    write_atomic,
)
from .model import ModelProfile

_AGAIN = "profile the model again with paraplan profile -o"
PROFILE_SCHEMA_VERSION = 12
"""Bumped on any incompatible change of the profile JSON (12: `mtp_modules`, `mtp_blocks`,
read from older versions as none; 11: `routing_groups`,
`routing_group_top_k`, read from older versions as not group-limited; 10: `dense_ffn`,
`shared_expert_ffn`, `latent_attention`, read from version 9 as absent; 9: each layer's
`attn_window`; 8: each layer's `act_norm_copy_bytes` and `act_glu_copy_bytes`; 7: each layer's
`autocast_saved_bytes`;
6: each layer's `saved_tensors`; 5: the embedding's `bwd_tmp_bytes` is per micro-batch,
weight-sized; 4 held it per traced sequence)."""


@cache
def profile_schema() -> dict[str, typing.Any]:
    """The profile JSON schema (draft 2020-12): a version and the `ModelProfile`, every
    per-layer figure (parameters, FLOPs, bytes, seconds) at least 0."""
    profile = object_schema(ModelProfile)
    for prop in profile["properties"]["layers"]["items"]["properties"].values():
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") in ("integer", "number"):
                branch["minimum"] = 0
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://paraplan.dev/profile.schema.json",
        "title": "paraplan model profile",
        "type": "object",
        "description": "A model as a chain of layers with their costs, per sequence.",
        "properties": {
            "schema_version": {"const": PROFILE_SCHEMA_VERSION},
            "profile": profile,
        },
        "required": ["schema_version", "profile"],
        "additionalProperties": False,
    }


def profile_to_dict(profile: ModelProfile) -> dict[str, typing.Any]:
    """The JSON form."""
    return {"schema_version": PROFILE_SCHEMA_VERSION, "profile": to_json(profile)}


def profile_from_dict(data: typing.Any, *, trusted: bool = False) -> ModelProfile:
    """Validate against the schema and build (ValueError on any problem). `trusted`: a document
    this paraplan wrote from a validated profile (the trace cache, whose key names the
    profiler's own source and the schema version): built without the schema walk, which takes
    most of a large trace's reading (25 s of DeepSeek-V3's 60 MB of op graphs); the built
    profile's own checks still run."""
    data = _upgrade_older(data)
    if isinstance(data, dict) and data.get("schema_version") not in (
        None,
        PROFILE_SCHEMA_VERSION,
    ):
        raise ValueError(
            f"schema_version {data.get('schema_version')!r} is not supported (this paraplan "
            f"reads version {PROFILE_SCHEMA_VERSION}); profile the model again"
        )
    huge = None
    if not trusted:
        validate(data, profile_schema(), "profile", _AGAIN)
        huge = limits.too_large(data)
    if huge is not None:
        raise ValueError(
            f"invalid profile at {huge[0]}: {limits.show_number(huge[1])} is larger than any "
            f"real figure (the limit is {limits.MAX_FIGURE:g}); {_AGAIN}"
        )
    profile: ModelProfile = from_json(ModelProfile, data["profile"])
    limits.check_profile(profile, where="profile")
    return profile


_SINCE_V10 = {"dense_ffn": 0, "shared_expert_ffn": 0, "latent_attention": None}
"""`profile` keys a version-9 profile did not record: what a model without a dense MLP size set
apart, shared experts or latent attention has (a version-9 profile of DeepSeek-V3 leaves its
Megatron export without them, as it was written then)."""


_SINCE_V11 = {"routing_groups": 1, "routing_group_top_k": 1}
"""`profile` keys a version-10 profile did not record: routing not group-limited (a version-10
profile of DeepSeek-V3 prices its dispatch as if any node could receive a token's experts)."""


_SINCE_V12 = {"mtp_modules": 0, "mtp_blocks": 0}
"""`profile` keys a version-11 profile did not record: no multi-token-prediction modules (a
version-11 profile of DeepSeek-V3 prices its decoder alone, as it did then)."""


def _upgrade_older(data: typing.Any) -> typing.Any:
    """A version-9 to -11 profile document as the current version (anything else
    unchanged)."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in (9, 10, 11):
        return data
    since = {
        **_SINCE_V12,
        **(_SINCE_V11 if version in (9, 10) else {}),
        **(_SINCE_V10 if version == 9 else {}),
    }
    out = dict(data, schema_version=PROFILE_SCHEMA_VERSION)
    if isinstance(out.get("profile"), dict):
        out["profile"] = {**since, **out["profile"]}
    return out


def save_profile(profile: ModelProfile, path: str | os.PathLike[str]) -> None:
    """Write atomically."""
    write_atomic(path, dumps_finite(profile_to_dict(profile), "profile", indent=1))


def load_profile(path: str | os.PathLike[str]) -> ModelProfile:
    """Read and strictly validate a profile JSON file."""
    data = read_json(path, "profile", "write one with paraplan profile -o")
    try:
        other = wrong_kind(data, Document.PROFILE, str(path))
        if other is not None:
            raise ValueError(other)
        return profile_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"profile file {str(path)!r}: {exc}") from None


if __name__ == "__main__":
    print(json.dumps(profile_schema(), indent=2))
