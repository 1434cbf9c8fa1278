"""Test-session settings: no test reads or writes the user's profile cache (`paraplan
profile_cache`); the cache's own tests turn it on in a temporary folder."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Turn the traced-profile cache off for the session (subprocesses inherit it)."""
    os.environ["PARAPLAN_NO_CACHE"] = "1"
