"""`--model` text and JSON spec files read into a `TransformerSpec` (strict: an unknown key,
value or preset is named with the accepted ones)."""

from __future__ import annotations

import difflib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from .hf_presets import HF_PRESETS
from .inputs import is_regular_file, read_json
from .model_spec import GPT_MATH, PRESETS, Attention, FfnKind, Norm, TransformerSpec

_FAMILIES: dict[str, dict[str, Any]] = {
    "gpt": {**GPT_MATH, "tied_embeddings": True},  # GPT-2/3 tie the output head
    "llama": {"ffn_kind": FfnKind.SWIGLU},
    "moe": {"ffn_kind": FfnKind.SWIGLU},
}
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_ENUMS = {"ffn_kind": FfnKind, "attention": Attention, "norm": Norm}
_KEY_ALIASES = {"kv": "kv_heads", "n_layers": "layers", "tied": "tied_embeddings"}


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(TransformerSpec)}


def _coerce(key: str, raw: object, source: str) -> object:
    kind = _field_types()[key]
    if key in _ENUMS:
        enum = _ENUMS[key]
        try:
            return enum(str(raw).lower())
        except ValueError:
            allowed = ", ".join(e.value for e in enum)
            raise ValueError(f"{source}: {key}={raw!r} is not one of {allowed}") from None
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        word = str(raw).lower()
        if word not in _BOOL_WORDS:
            raise ValueError(f"{source}: {key}={raw!r} must be true or false")
        return _BOOL_WORDS[word]
    if kind == "int":
        if isinstance(raw, bool):
            raise ValueError(f"{source}: {key}={raw!r} must be an integer")
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw).replace("_", ""))
        except ValueError:
            raise ValueError(f"{source}: {key}={raw!r} must be an integer") from None
    return str(raw)


def spec_from_mapping(values: dict[str, object], *, source: str, base: dict | None = None):
    """Build a spec from key/value pairs, naming any unknown key and the accepted ones."""
    known = _field_types()
    kwargs: dict[str, object] = dict(base or {})
    for raw_key, raw in values.items():
        key = _KEY_ALIASES.get(raw_key, raw_key)
        if key not in known:
            raise ValueError(
                f"{source}: unknown key {raw_key!r}; accepted keys: {', '.join(sorted(known))}"
            )
        kwargs[key] = _coerce(key, raw, source)
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in kwargs]
    if missing:
        raise ValueError(f"{source}: missing {', '.join(missing)}; e.g. {MODEL_FORMS}")
    try:
        return TransformerSpec(**kwargs)  # type: ignore[arg-type]
    except TypeError as exc:  # pragma: no cover - every key is checked above
        raise ValueError(f"{source}: {exc}") from None


MODEL_FORMS = (
    "a preset (" + ", ".join(PRESETS) + "), "
    "'gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048' (families gpt, llama, moe; "
    "keys: layers, hidden, heads, kv_heads, ffn, ffn_kind, vocab, seq, tied_embeddings, "
    "experts, top_k, expert_ffn, ...), or a path to a .json spec file"
)


def parse_model(text: str) -> TransformerSpec:
    """Parse `--model`: a preset name, `family:key=value,...`, or a JSON spec file."""
    text = text.strip()
    if text.lower() in PRESETS:
        return PRESETS[text.lower()]
    if text.endswith(".json") or is_regular_file(text):
        return load_spec_file(Path(text))
    if ":" in text:
        family, _, body = text.partition(":")
        family = family.lower()
        if family not in _FAMILIES:
            raise ValueError(f"--model {text!r}: unknown family {family!r}; expected {MODEL_FORMS}")
        values: dict[str, object] = {"name": text}
        for token in filter(None, (t.strip() for t in body.split(","))):
            key, eq, value = token.partition("=")
            if not eq or not key or not value:
                raise ValueError(
                    f"--model: bad token {token!r} (expected key=value); forms: {MODEL_FORMS}"
                )
            values[key.strip().lower()] = value.strip()
        return spec_from_mapping(values, source=f"--model {text!r}", base=_FAMILIES[family])
    if text.lower() in HF_PRESETS:
        raise ValueError(
            f"--model {text!r} is a Hugging Face preset with no analytic spec (its attention "
            "or experts have no sizes-only form here): trace it with --model-source auto or "
            "trace"
        )
    close = difflib.get_close_matches(text.lower(), list(PRESETS), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"--model {text!r}: not a known model; {hint}expected {MODEL_FORMS}")


def load_spec_file(path: Path) -> TransformerSpec:
    """Load a spec written by `TransformerSpec.to_dict` (strict: unknown keys rejected)."""
    data = read_json(path, what="model file", hint=f"expected {MODEL_FORMS}")
    if not isinstance(data, dict):
        raise ValueError(f"model file {str(path)!r}: expected a JSON object of spec keys")
    data.setdefault("name", path.stem)
    return spec_from_mapping(data, source=f"model file {str(path)!r}")


def with_name(spec: TransformerSpec, name: str) -> TransformerSpec:
    """The same spec under another name."""
    return replace(spec, name=name)
