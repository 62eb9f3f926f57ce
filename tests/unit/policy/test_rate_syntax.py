"""The rate syntax of the duration parser (issue 13 item 5): a rate key takes a rate ("5/s", "300/m",
"1/h", read as its gap) or a gap ("200ms"); a bare number other than 0 is refused with a hint; and a gap
is shown back as "200ms (5/s)".
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.config.loading import build
from politeproxy.policy.settings import (
    DURATION_BOUNDS,
    RATE_KEYS,
    ConfigError,
    accepts_rate,
    duration_bounds,
    format_duration,
    format_gap,
    format_rate,
    parse_duration,
)

RATE_KEY_NAMES = [k for k in RATE_KEYS if "*" not in k] + ["hosts.index.commoncrawl.org.interval"]
OTHER_KEYS = sorted(k for k in DURATION_BOUNDS if not accepts_rate(k))

# Text made of what rates and durations are made of, plus hostile characters.
rate_text = st.text(alphabet="0123456789./ smhinecour-+_\u0661\u00b2\x00", max_size=24)
numbers = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=250, deadline=None)
@given(
    value=st.one_of(rate_text, numbers, st.text(max_size=30)),
    key=st.sampled_from(RATE_KEY_NAMES + OTHER_KEYS),
)
@example(value="0/s", key="schedule.global_rate")
@example(value="0.0000000000001/h", key="schedule.global_rate")
@example(value="999999999999999/s", key="exempt.rate")
@example(value="5/ms", key="schedule.global_rate")
@example(value="nan/s", key="schedule.global_rate")
@example(value="5/s", key="pacing.max_wait")
def test_rates_and_gaps_never_raise_and_stay_finite_and_bounded(value: Any, key: str) -> None:
    """Whatever the value, parse_duration returns a finite gap within the key's bounds or raises a
    one-line ConfigError that starts with the key; never another exception, never NaN or infinity."""
    lo, hi = duration_bounds(key)
    try:
        got = parse_duration(value, key)
    except ConfigError as e:
        text = str(e)
        assert text.startswith(f"{key}: ") and "\n" not in text and len(text) < 400
        return
    assert isinstance(got, float) and math.isfinite(got) and lo <= got <= hi


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=100_000),
    unit=st.sampled_from(["s", "sec", "m", "min", "h", "hour"]),
    key=st.sampled_from(RATE_KEY_NAMES),
)
def test_a_rate_is_the_gap_of_its_unit_divided_by_n(n: int, unit: str, key: str) -> None:
    """N per unit is one grant every unit/N seconds (5/s = 200 ms), when within the key's bounds."""
    span = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}[unit]
    lo, hi = duration_bounds(key)
    if span / n > hi:
        with pytest.raises(ConfigError):
            parse_duration(f"{n}/{unit}", key)
        return
    assert parse_duration(f"{n}/{unit}", key) == pytest.approx(span / n)
    assert parse_duration(f" {n} / {unit.upper()} ", key) == pytest.approx(span / n)


@pytest.mark.parametrize(
    ("rate", "gap"), [("5/s", "200ms"), ("300/m", "200ms"), ("1/h", "1h"), ("2/s", "500ms"), ("0.5/s", "2s")]
)
def test_rate_and_gap_spellings_agree(rate: str, gap: str) -> None:
    """The documented equivalences: 5/s and 300/m are both a gap of 200 ms; 1/h is a gap of an hour."""
    assert parse_duration(rate, "schedule.global_rate") == pytest.approx(
        parse_duration(gap, "schedule.global_rate")
    )


@settings(max_examples=100, deadline=None)
@given(value=st.one_of(st.integers(1, 10**6), st.floats(1e-6, 1e6), st.integers(1, 10**6).map(str)))
def test_bare_numbers_are_refused_with_both_readings(value: Any) -> None:
    """A bare number other than 0 (TOML int or float, or a string of digits) is refused for every
    duration key; for a rate key the message offers both readings, N/s and Ns."""
    for key in RATE_KEY_NAMES:
        with pytest.raises(ConfigError, match=r"bare number .*: write .*/s for a rate or .*s for a gap"):
            parse_duration(value, key)
    for key in OTHER_KEYS:
        with pytest.raises(ConfigError, match=r"bare number .*: write .*s \(a duration needs a unit"):
            parse_duration(value, key)


def test_the_issue_example_and_zero() -> None:
    """`global_rate = 5` says what to write instead; 0, "0", 0.0 and "off" still mean off."""
    with pytest.raises(ConfigError) as e:
        build({"schedule": {"global_rate": 5}})
    assert str(e.value) == "schedule.global_rate: bare number 5: write 5/s for a rate or 5s for a gap"
    for zero in (0, 0.0, "0", "0.0", "off", "0s"):
        assert build({"schedule": {"global_rate": zero}})["schedule"]["global_rate"] == 0.0


def test_a_rate_fits_only_keys_that_space_grants() -> None:
    """A timeout or a hold takes no rate: "5/s" for max_wait is an error, not 200 ms."""
    with pytest.raises(ConfigError, match="pacing.max_wait: .*fits only rate keys"):
        parse_duration("5/s", "pacing.max_wait")
    with pytest.raises(ConfigError, match="a rate of 0 never grants"):
        parse_duration("0/s", "schedule.global_rate")
    cfg = build({"exempt": {"rate": "50/s"}, "hosts": {"index.commoncrawl.org": {"interval": "1/s"}}})
    assert cfg["exempt"]["rate"] == pytest.approx(0.02)
    assert cfg.host_intervals() == (("index.commoncrawl.org", 1.0),)


@settings(max_examples=500, deadline=None)
@given(gap=st.floats(min_value=1e-6, max_value=3600.0))
def test_a_gap_shown_back_reads_as_about_the_same_gap(gap: float) -> None:
    """format_rate and format_duration print what the parser reads back (no exponents), within the
    rounding of four significant digits; format_gap shows both."""
    as_rate = parse_duration(format_rate(gap), "schedule.global_rate")
    as_gap = parse_duration(format_duration(gap), "schedule.global_rate")
    assert as_rate == pytest.approx(gap, rel=1e-3)
    assert as_gap == pytest.approx(gap, rel=1e-3, abs=1e-9)
    assert format_gap(gap) == f"{format_duration(gap)} ({format_rate(gap)})"


def test_how_a_gap_is_shown() -> None:
    """The forms the start-up lines print."""
    assert format_gap(0.2) == "200ms (5/s)"
    assert format_gap(1.0) == "1s (1/s)"
    assert format_gap(30.0) == "30s (2/m)"
    assert format_gap(3600.0) == "60m (1/h)"
    assert format_gap(0.0) == "off"
    assert format_gap(0.02) == "20ms (50/s)"
