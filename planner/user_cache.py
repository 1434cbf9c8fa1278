"""The user cache folder paraplan keeps what it computed before in (traced profiles,
`paraplan/profile_cache.py`; schedule replays, `replay_store.py`).

Where: `$PARAPLAN_CACHE_DIR`, else `$XDG_CACHE_HOME/paraplan`, else `~/.cache/paraplan`;
`PARAPLAN_NO_CACHE=1` turns every cache off. Nothing happens at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

DISABLE_ENV = "PARAPLAN_NO_CACHE"
"""Set to 1 to compute everything every time."""
DIR_ENV = "PARAPLAN_CACHE_DIR"
"""Where the entries go (default: the user cache directory)."""


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "paraplan"
