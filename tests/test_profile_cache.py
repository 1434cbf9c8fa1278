"""The traced-profile cache: a second trace of the same config comes from disk and equals
the first; a corrupt entry is traced again and rewritten; another sequence length is another
entry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import paraplan
from paraplan import profile_cache
from paraplan.planner import user_cache

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "gpt2-tiny.json"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(user_cache.DISABLE_ENV, raising=False)
    monkeypatch.setenv(user_cache.DIR_ENV, str(tmp_path))
    return tmp_path


def test_second_trace_comes_from_the_cache_and_equals_the_first(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    (entry,) = cache.glob("*.json")

    def no_trace(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced again despite a cache entry")

    monkeypatch.setattr("paraplan.profiler.hf.profile_hf", no_trace)
    again = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    assert again == first
    other = profile_cache.cache_key(str(CONFIG), seq_len=32, precision="fp32")
    assert entry.stem != other  # another sequence length is another entry


def test_corrupt_entry_is_traced_again_and_rewritten(cache: Path) -> None:
    first = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    (entry,) = cache.glob("*.json")
    entry.write_text('{"schema_version": 3, "profile": {"name": "truncat')
    again = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    assert again == first
    assert json.loads(profile_cache.read_entry(entry).body)["profile"]["name"] == first.name


def test_an_edited_entry_is_traced_again(cache: Path) -> None:
    """An entry is built without the schema walk, so what is served must be what `store`
    wrote: a valid-looking edit (a block's FLOPs made negative) breaks the body's digest and
    the config is traced again."""
    first = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    (entry,) = cache.glob("*.json")
    stored = profile_cache.read_entry(entry)
    data = json.loads(stored.body)
    data["profile"]["layers"][1]["fwd_flops"] = -1.0
    entry.write_text(replace(stored, body=json.dumps(data)).text())  # the old digest kept
    again = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    assert again == first
    assert json.loads(profile_cache.read_entry(entry).body) != data  # rewritten


def test_off_by_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(user_cache.DISABLE_ENV, "1")
    paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    assert not list(cache.glob("*.json"))


def test_entry_of_another_trace_is_not_trusted(cache: Path) -> None:
    """A valid profile filed under the wrong key (here the sequence-32 trace copied to the
    sequence-64 entry) is traced again and replaced, never served."""
    short = paraplan.model_profile(str(CONFIG), seq_len=32, precision="fp32")
    (short_entry,) = cache.glob("*.json")
    entry = cache / f"{profile_cache.cache_key(str(CONFIG), seq_len=64, precision='fp32')}.json"
    entry.write_text(short_entry.read_text())
    again = paraplan.model_profile(str(CONFIG), seq_len=64, precision="fp32")
    assert (short.seq_len, again.seq_len) == (32, 64)
    assert profile_cache.read_entry(entry).cache_key["seq_len"] == 64


def test_the_key_covers_the_profilers_own_source() -> None:
    """A changed tracer never serves old entries: the digest reads the modules the profile is
    traced by (until 2026-11-26 it globbed a folder that does not exist in a checkout)."""
    import paraplan.profiler.tracer as tracer
    from paraplan.profile_cache import profiler_sources

    names = {p.name for p in profiler_sources()}
    assert {"tracer.py", "api.py", "attention.py", "autocast_trace.py"} <= names
    assert Path(tracer.__file__).resolve() in {p.resolve() for p in profiler_sources()}
