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


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hugging Face's advisories (e.g. "`loss_type=None` was set in the config but it is
    unrecognized") silenced inside the block and the verbosity restored afterwards: paraplan
    builds configs and models itself, so they address no one. Errors still show."""
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)
