"""A small model's figures keep their significant digits (issue 16's output polish): the
README's CPU example steps in 9 ms on 0.26 GiB, which three decimals of a second and two of a
GiB printed as "0.009 s vs 0.009 s per step (+0.000 s)", "0.00 GiB" and "0.00B params"."""

from __future__ import annotations

from pathlib import Path

import pytest

import paraplan
from paraplan.planner.explain import explain, format_plan
from paraplan.planner.units import GIB, count, figure, gib, seconds

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (72 * GIB, "72.00 GiB"),
        (0.26 * GIB, "0.26 GiB"),  # two significant digits already: unchanged
        (0.0012 * GIB, "0.00120 GiB"),
        (0.0999 * GIB, "0.0999 GiB"),
        (0, "0.00 GiB"),
        (238, "<0.00001 GiB"),  # under 10 KiB
    ],
)
def test_gib(nbytes: float, text: str) -> None:
    assert gib(nbytes) == text


@pytest.mark.parametrize(
    ("value_s", "text", "signed"),
    [
        (20.538, "20.538 s", "+20.538 s"),
        (0.464, "0.464 s", "+0.464 s"),
        (0.009123, "9.12 ms", "+9.12 ms"),
        (0.0123, "12.3 ms", "+12.3 ms"),
        (0.0000369, "36.9 us", "+36.9 us"),
        (0.0, "0.000 s", "+0.000 s"),
        (-0.0005, "-0.500 ms", "-0.500 ms"),
    ],
)
def test_seconds(value_s: float, text: str, signed: str) -> None:
    assert seconds(value_s) == text
    assert seconds(value_s, sign=True) == signed


def test_counts_and_rates() -> None:
    assert count(174.6e9) == "174.60B"
    assert count(124_440_000) == "124.44M"
    assert count(241_024) == "241.0K"
    assert count(512) == "512"
    assert figure(412.345) == "412.3" and figure(0.04371) == "0.0437"


def test_the_readme_cpu_example_prints_no_zero_figures() -> None:
    out = paraplan.plan(
        str(ROOT / "examples" / "configs" / "gpt2-tiny.json"),
        "2xcpu",
        global_batch=8,
        seq_len=64,
    ).plan
    assert out.predicted.step_time_s < 0.1  # the case this tests
    text = format_plan(out) + "\n" + explain(out)
    for zero in ("0.00B params", "0.0 TFLOP/s", "(+0.000 s)", "0.000 s vs", "0.00 GiB more"):
        assert zero not in text, zero
    assert f"({count(out.model.num_params)} params)" in text
    assert "K params" in text or "M params" in text
    assert f"step time     {seconds(out.predicted.step_time_s)}" in text
    assert " ms " in text.split("Runners-up")[0]
    assert "step ms" in text  # the runners-up column follows the plan's unit


def test_report_columns_keep_significant_digits() -> None:
    from paraplan.report.render import COLUMNS

    step = next(c for c in COLUMNS if c.field == "predicted.step_time_s")
    tokens = next(c for c in COLUMNS if c.header == "tokens/s")
    assert step.text(20.5381) == "20.538" and step.text(0.009123) == "0.00912"
    assert tokens.text(54384.4) == "54,384"
