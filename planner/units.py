"""The one memory unit every output uses: GiB (2^30 bytes); and the figures of a small model
(a CPU example's 9 ms steps, 0.3 GiB) printed with their significant digits, not as 0.000 s
or 0.00 GiB.

Vendors state HBM capacity in binary units under a decimal name (an "80 GB" A100 or H100 holds
80 GiB, which is what `torch.cuda.get_device_properties().total_memory` reports), so GiB is what
matches both the datasheet figure and the memory the framework sees; a decimal GB would show an
80 GB part as "85.9 GB"."""

from __future__ import annotations

import math

GIB = 2**30
"""Bytes per GiB."""
MIB = 2**20
"""Bytes per MiB (per-layer, per-sequence figures: `paraplan profile`'s table)."""
UNIT_NOTE = "GiB = 2^30 bytes; an '80 GB' GPU holds 80 GiB"
"""Said once where memory is printed."""


SIGNIFICANT = 3
"""Significant digits of a figure too small for the fixed decimals (`gib`, `seconds`)."""


def _decimals(value: float, fixed: int) -> int:
    """`fixed` decimals, or, where they would show fewer than two significant digits of a
    non-zero `value`, `SIGNIFICANT` of them (0.00117, not 0.00)."""
    size = abs(value)
    if size == 0 or size >= 10 ** (1 - fixed):
        return fixed
    return max(fixed, _significant(size))


def _significant(size: float) -> int:
    """Decimals that show `SIGNIFICANT` significant digits of `size` > 0."""
    return max(0, SIGNIFICANT - 1 - math.floor(math.log10(size)))


GIB_DECIMALS = 5
"""Most decimals `gib` prints: a figure under 10^-5 GiB (10 KiB) reads "<0.00001 GiB"."""


def gib(nbytes: float, digits: int = 2) -> str:
    """`nbytes` as ``"12.34 GiB"``; a figure under 0.1 GiB keeps three significant digits
    (``"0.00117 GiB"``), at most `GIB_DECIMALS` decimals."""
    value = nbytes / GIB
    if 0 < abs(value) < 10**-GIB_DECIMALS:
        return f"{'>-' if value < 0 else '<'}{10**-GIB_DECIMALS:.{GIB_DECIMALS}f} GiB"
    return f"{value:,.{min(GIB_DECIMALS, _decimals(value, digits))}f} GiB"


def figure(value: float, decimals: int = 1) -> str:
    """A rate or size as ``"412.3"`` (`decimals` decimals), or with three significant digits
    where those would show fewer than two (``"0.0437"``: a CPU's TFLOP/s)."""
    return f"{value:,.{_decimals(value, decimals)}f}"


WHOLE_SECONDS_FROM_S = 0.1
"""`seconds` prints seconds with three decimals from here up, ms or us below."""


def seconds(value_s: float, *, sign: bool = False) -> str:
    """Seconds as ``"20.538 s"`` (three decimals); under 0.1 s with three significant digits
    in ms or us (``"9.12 ms"``, ``"12.3 us"``), where three decimals of a second would read
    0.009 or 0.000. `sign`: always a sign (``"+9.12 ms"``)."""
    plus = "+" if sign else ""
    size = abs(value_s)
    if size == 0 or size >= WHOLE_SECONDS_FROM_S:
        return f"{value_s:{plus},.3f} s"
    if size >= 1e-4:
        scaled, unit = value_s * 1e3, "ms"
    else:
        scaled, unit = value_s * 1e6, "us"
    return f"{scaled:{plus}.{_significant(abs(scaled))}f} {unit}"


def count(n: float) -> str:
    """A parameter count as ``"174.60B"``, ``"124.44M"``, ``"431.5K"`` or ``"512"``."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:,.{1 if suffix == 'K' else 2}f}{suffix}"
    return f"{n:,.0f}"
