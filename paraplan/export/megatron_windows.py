"""Sliding-window attention in Megatron-LM's terms: the flags a plan's windows are written as
(`window_args`) and the windows a Megatron argument file states (`windows_said`).

megatron-core gives every windowed block one `window_size` (left, right), Transformer Engine's
and its own unfused mask's convention: a query at position i sees the keys i - left to
i + right (`transformer/utils.get_sliding_window_causal_mask`), under the causal mask i - left
to i. A window of w keys as Hugging Face counts it (`sliding_window`: the query itself and the
w - 1 before it; `masking_utils.sliding_window_overlay` keeps kv > q - w) is left = w - 1.
Which blocks have it: `window_attn_skip_freq`, read by `transformer/utils.
is_layer_window_attention` (blocks counted from 1): none given, every block; an integer n, all
but blocks n, 2n, ...; a list, 1 for a windowed block. Megatron-LM's argument parser takes the
list as a Python expression (`moe_freq_type`), e.g. ``[1,1,1,0]*3``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from ..planner.plan import ModelInfo
from .setup import StatedWindows

MAX_PATTERN = 100_000
"""Most blocks a pattern expression may name (far beyond any model; a larger product is
refused before it is built)."""


def window_args(model: ModelInfo) -> list[tuple[str, object]]:
    """The ``--window-size`` and ``--window-attn-skip-freq`` flags of the plan's blocks
    (`ModelInfo.attention_windows`; none without a window): the skip frequency an integer
    where the blocks attending to the whole sequence are every n-th, else the list; left out
    when every block has the window. One window size only (megatron-core's one
    `window_size`): `megatron.nearest` refuses several."""
    windows = model.attention_windows
    sizes = {w for w in windows if w}
    if not sizes:
        return []
    args: list[tuple[str, object]] = [("window-size", f"{max(sizes) - 1},0")]
    pattern = [1 if w else 0 for w in windows]
    if all(pattern):
        return args
    every = next(
        (
            n
            for n in range(2, len(pattern) + 1)
            if all(p == (0 if (i + 1) % n == 0 else 1) for i, p in enumerate(pattern))
        ),
        None,
    )
    skip = str(every) if every else "[" + ",".join(map(str, pattern)) + "]"
    return [*args, ("window-attn-skip-freq", skip)]


def windows_said(args: dict[str, str | None], blocks: int, source: str) -> StatedWindows:
    """Each block's window in keys (0: the whole sequence) as the arguments build the model's
    `blocks` blocks (module docstring); ValueError naming a value megatron-core would not
    read as a window."""
    size = args.get("window-size")
    if size is None:
        return StatedWindows(value=(0,) * blocks, flag="no --window-size")
    parts = size.strip().strip("()").split(",")
    try:
        left, right = (int(part) for part in parts)
    except ValueError:
        raise ValueError(
            f"{source}: --window-size {size!r} must be two integers, left and right (e.g. "
            "4095,0 for a window of 4096 keys)"
        ) from None
    if left < -1 or right < -1:
        raise ValueError(f"{source}: --window-size {size!r}: -1 (no limit) is the least")
    keys = 0 if left == -1 else left + 1  # the causal mask hides the right side
    pattern = _pattern(args.get("window-attn-skip-freq"), blocks, source)
    return StatedWindows(
        value=tuple(keys if windowed else 0 for windowed in pattern), flag="--window-size"
    )


def _pattern(skip: str | None, blocks: int, source: str) -> tuple[bool, ...]:
    """Which of `blocks` blocks have the window under ``--window-attn-skip-freq skip``."""
    if skip is None:
        return (True,) * blocks
    return block_bits(
        skip,
        blocks,
        "--window-attn-skip-freq",
        source,
        every=lambda i, n: (i + 1) % n != 0,
        meaning="every n-th block attends to the whole sequence",
    )


def block_bits(
    text: str,
    blocks: int,
    flag: str,
    source: str,
    *,
    every: Callable[[int, int], bool],
    meaning: str,
) -> tuple[bool, ...]:
    """One bit per block from a Megatron-LM pattern flag (`moe_freq_type`: a whole number n,
    each block i's bit `every(i, n)` counted from 0; or a list expression of 0 and 1, one per
    block); ValueError naming the flag, the value and the forms taken."""
    text = text.strip()
    if "[" not in text:  # a whole number, as Megatron-LM's `moe_freq_type` reads it
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"{source}: {flag} {text!r} must be a whole number n >= 1 ({meaning}) or a "
                "list of 0 and 1 such as ([1]*3+[0])*2"
            )
        n = int(text)
        return tuple(every(i, n) for i in range(blocks))
    try:
        items = _list_of_bits(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        raise ValueError(
            f"{source}: {flag} {text!r} is not a list of 0 and 1 (lists, + and * by a whole "
            "number, as in ([1]*3+[0])*2)"
        ) from None
    if len(items) != blocks:
        raise ValueError(
            f"{source}: {flag} {text!r} names {len(items)} blocks, but --num-layers is "
            f"{blocks}; give one 0 or 1 per block"
        )
    return tuple(bool(item) for item in items)


def _list_of_bits(node: ast.expr) -> list[int]:
    """The list a pattern expression evaluates to, where Megatron-LM evaluates it as Python
    (`_eval_pattern`): only list literals of 0 and 1, their sums, and their products by a
    whole number are taken here (ValueError otherwise)."""
    if isinstance(node, ast.List):
        bits: list[int] = []
        for e in node.elts:
            if not isinstance(e, ast.Constant) or type(e.value) is not int or e.value not in (0, 1):
                raise ValueError("not 0 or 1")
            bits.append(e.value)
        return bits
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_of_bits(node.left) + _list_of_bits(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for items, times in ((node.left, node.right), (node.right, node.left)):
            if isinstance(times, ast.Constant) and type(times.value) is int and times.value >= 0:
                once = _list_of_bits(items)
                if len(once) * times.value > MAX_PATTERN:
                    raise ValueError("too long")
                return once * times.value
    raise ValueError("not a pattern")
