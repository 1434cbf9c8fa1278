"""The one memory unit every output uses: GiB (2^30 bytes).

Vendors state HBM capacity in binary units under a decimal name (an "80 GB" A100 or H100 holds
80 GiB, which is what `torch.cuda.get_device_properties().total_memory` reports), so GiB is what
matches both the datasheet figure and the memory the framework sees; a decimal GB would show an
80 GB part as "85.9 GB"."""

from __future__ import annotations

GIB = 2**30
"""Bytes per GiB."""
UNIT_NOTE = "GiB = 2^30 bytes; an '80 GB' GPU holds 80 GiB"
"""Said once where memory is printed."""


def gib(nbytes: float, digits: int = 2) -> str:
    """`nbytes` as ``"12.34 GiB"``."""
    return f"{nbytes / GIB:,.{digits}f} GiB"
