"""Environment variables set for the duration of a call, never at import time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def scoped_env(name: str, value: str, *, override: bool = True) -> Iterator[None]:
    """Set the environment variable `name` to `value` inside the block and restore what was
    there (or its absence) afterwards. With ``override=False`` a value already set wins."""
    old = os.environ.get(name)
    if override or old is None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
