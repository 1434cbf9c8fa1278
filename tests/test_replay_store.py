"""Schedule replays stored between runs (planner/replay_store.py, issue 16): an answer read
back equals the one computed with no store, bit for bit; damaged, edited, non-finite or
another code's files are never read; nothing is written with caching off; and a plan made
with stored replays is the plan made without them (search processes included)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import paraplan
from paraplan.planner import replay_store, user_cache
from paraplan.planner.cost import schedules
from paraplan.planner.replay_store import MAX_ENTRIES, ReplayStore
from paraplan.planner.solvers import replay_table
from paraplan.planner.strategy import Schedule

PEAKS_ARGS = (Schedule.ZBV, 8, 2, 16, 1.0 / 3.0, 2.0 / 3.0, 0.5, 0.5)
"""`in_flight_peaks`'s arguments: ZB-V on 8 stages, 16 micro-batches."""
BUBBLE_ARGS = (Schedule.DUALPIPEV, 8, 2, 16, 0.333, 0.667, 0.5)
"""`schedules._unit_bubble`'s: DualPipeV on 8 stages at a rounded forward share."""


def _uncached() -> tuple[tuple[float, ...], float]:
    """Both answers computed now (the process memos cleared, the store off)."""
    replay_table.in_flight_peaks.cache_clear()
    schedules._unit_bubble.cache_clear()
    return replay_table.in_flight_peaks(*PEAKS_ARGS), schedules._unit_bubble(*BUBBLE_ARGS)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ReplayStore:
    """A fresh store on a cache folder of its own (the test session turns caching off)."""
    monkeypatch.delenv(user_cache.DISABLE_ENV, raising=False)
    monkeypatch.setenv(user_cache.DIR_ENV, str(tmp_path))
    fresh = ReplayStore()
    monkeypatch.setattr(replay_store, "STORE", fresh)
    return fresh


def _files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "replays").glob("*/*"))


def test_answers_read_back_bit_for_bit(
    store: ReplayStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(user_cache.DISABLE_ENV, "1")
    truth = _uncached()  # no store: computed
    monkeypatch.delenv(user_cache.DISABLE_ENV)
    first = _uncached()  # computed and kept
    store.flush()
    assert [p.name for p in _files(tmp_path)] == ["bubble-dualpipev-8", "peaks-zbv-8"]
    reread = ReplayStore()  # another process: reads the files
    monkeypatch.setattr(replay_store, "STORE", reread)
    peaks, bubble = _uncached()
    assert first == truth
    assert peaks == truth[0] and bubble == truth[1]  # floats equal, not merely close
    assert reread.get("peaks", Schedule.ZBV, 8, PEAKS_ARGS[2:]) == truth[0]
    assert reread.get("bubble", Schedule.DUALPIPEV, 8, BUBBLE_ARGS[2:]) == truth[1]


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # truncated
        lambda text: text.replace("0.", "9.", 1),  # edited: the digest no longer matches
        lambda text: "not json\n{}",
        lambda text: "",
    ],
)
def test_damaged_files_are_not_read(store: ReplayStore, tmp_path: Path, damage) -> None:
    _uncached()
    store.flush()
    for path in _files(tmp_path):
        path.write_text(damage(path.read_text()))
    assert ReplayStore().get("peaks", Schedule.ZBV, 8, PEAKS_ARGS[2:]) is None
    assert ReplayStore().get("bubble", Schedule.DUALPIPEV, 8, BUBBLE_ARGS[2:]) is None


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"1.5"', "true", "[1.0, null]"])
def test_a_file_with_anything_but_finite_numbers_is_not_read(
    store: ReplayStore, tmp_path: Path, value: str
) -> None:
    _uncached()
    store.flush()
    path = next(p for p in _files(tmp_path) if p.name.startswith("bubble"))
    body = '{"2,16,0.333,0.667,0.5":' + value + "}"
    path.write_text(json.dumps({"sha256": hashlib.sha256(body.encode()).hexdigest()}) + "\n" + body)
    assert ReplayStore().get("bubble", Schedule.DUALPIPEV, 8, BUBBLE_ARGS[2:]) is None


def test_another_codes_answers_are_not_read(store: ReplayStore, tmp_path: Path) -> None:
    """Answers live under a digest of the replay's source: a folder written by other code is
    another folder, never read."""
    _uncached()
    store.flush()
    (folder,) = (tmp_path / "replays").iterdir()
    assert folder.name == replay_store._digest()
    folder.rename(tmp_path / "replays" / "0123456789abcdef")
    assert ReplayStore().get("peaks", Schedule.ZBV, 8, PEAKS_ARGS[2:]) is None


def test_nothing_is_written_with_caching_off(
    store: ReplayStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(user_cache.DISABLE_ENV, "1")
    _uncached()
    store.flush()
    assert not (tmp_path / "replays").exists()


def test_a_file_keeps_the_newest_answers(store: ReplayStore, tmp_path: Path) -> None:
    for i in range(MAX_ENTRIES + 10):
        store.put("bubble", Schedule.ZBV, 4, (i,), float(i))
    store.flush()
    reread = ReplayStore()
    assert reread.get("bubble", Schedule.ZBV, 4, (9,)) is None  # the oldest dropped
    assert reread.get("bubble", Schedule.ZBV, 4, (10,)) == 10.0
    assert reread.get("bubble", Schedule.ZBV, 4, (MAX_ENTRIES + 9,)) == MAX_ENTRIES + 9.0


def test_flushes_merge_what_other_processes_wrote(store: ReplayStore) -> None:
    other = ReplayStore()
    other.put("bubble", Schedule.ZBV, 4, (1,), 1.0)
    store.put("bubble", Schedule.ZBV, 4, (2,), 2.0)
    other.flush()
    store.flush()
    reread = ReplayStore()
    assert reread.get("bubble", Schedule.ZBV, 4, (1,)) == 1.0
    assert reread.get("bubble", Schedule.ZBV, 4, (2,)) == 2.0


def test_a_plan_from_stored_replays_is_the_plan_without(
    store: ReplayStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt3-175b on 1024 A100s (split-backward schedules among its best), searched by two
    processes: cold, then from what both stored, then with no store at all."""
    monkeypatch.setenv("PARAPLAN_SEARCH_WORKERS", "2")

    def planned() -> list[tuple]:
        replay_table.in_flight_peaks.cache_clear()
        schedules._unit_bubble.cache_clear()
        schedules._replayed.cache_clear()
        out = paraplan.plan("gpt3-175b", "1024xa100-80gb", global_batch=1536, seq_len=2048)
        return [(e.strategy, e.step_time_s, e.memory.total_bytes) for e in out.result.ranked]

    cold = planned()
    stored = {p.name for p in _files(tmp_path)}
    assert any(name.startswith("bubble-") for name in stored)
    assert any(name.startswith("peaks-") for name in stored)
    monkeypatch.setattr(replay_store, "STORE", ReplayStore())  # a new process's
    warm = planned()
    monkeypatch.setenv(user_cache.DISABLE_ENV, "1")
    monkeypatch.setattr(replay_store, "STORE", ReplayStore())
    assert cold == warm == planned()


def test_an_unwritable_cache_folder_leaves_planning_uncached(
    store: ReplayStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(user_cache.DIR_ENV, str(blocker))  # the folder cannot be made
    truth = _uncached()
    store.flush()  # no error
    assert blocker.read_text() == "not a folder"
    assert ReplayStore().get("peaks", Schedule.ZBV, 8, PEAKS_ARGS[2:]) is None
    assert _uncached() == truth
