"""Property tests for the parsers of config values, Retry-After headers and host names.

Each property says what it checks in its docstring. None of these parsers may raise anything but the
documented error, and none may return a non-finite or negative time.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.config.loading import ConfigError, build
from politeproxy.policy.backoff import RETRY_AFTER_MAX, parse_retry_after
from politeproxy.policy.hosts import normalize_host, valid_hostname, validate_pattern
from politeproxy.policy.settings import (
    DURATION_BOUNDS,
    ENV_NUMBERS,
    check_number,
    duration_bounds,
    env_number,
    parse_duration,
    parse_number,
)

NOW = 1_750_000_000.0
DURATION_KEYS = sorted(k for k in DURATION_BOUNDS if "*" not in k) + ["hosts.data.commoncrawl.org.interval"]
HOSTILE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1", "-0.5", "1_0", "١", "²", "1e9", "+5"]

# Strings made of the characters a duration is made of, and of everything else.
duration_text = st.text(alphabet="0123456789.-+_ emshuinfatNI\x00\u0661\u00b2", max_size=30)
any_value = st.one_of(
    st.text(max_size=40),
    duration_text,
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=600, deadline=None)
@given(value=any_value, key=st.sampled_from(DURATION_KEYS))
@example(value="nan", key="schedule.global_rate")
@example(value="1e400", key="pacing.max_wait")
@example(value=float("inf"), key="schedule.global_rate")
@example(value=10**5000, key="pacing.backoff_cap")
@example(value="9" * 5000, key="pacing.backoff_cap")
def test_parse_duration_is_finite_bounded_or_config_error(value: Any, key: str) -> None:
    """parse_duration returns a finite number within the key's bounds (never nan, inf or negative), or
    raises ConfigError naming the key; no other exception, whatever the value."""
    lo, hi = duration_bounds(key)
    try:
        got = parse_duration(value, key)
    except ConfigError as e:
        assert str(e).startswith(f"{key}: ") and "\n" not in str(e) and len(str(e)) < 400
        return
    assert isinstance(got, float) and math.isfinite(got) and lo <= got <= hi


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_duration_strings_are_refused(bad: str) -> None:
    """The strings float() accepts but a duration is not (nan, inf, exponents, signs, other scripts'
    digits, underscores) are ConfigErrors for every duration key."""
    for key in DURATION_KEYS:
        with pytest.raises(ConfigError):
            parse_duration(bad, key)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=0, max_value=3600), unit=st.sampled_from(["", "s", "ms", "m"]))
def test_parse_duration_reads_plain_durations(n: int, unit: str) -> None:
    """A whole number with a unit reads as that many seconds, when within the bound of global_rate; a
    bare number other than 0 is refused (it could mean a rate or a gap)."""
    scale = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0}[unit]
    text = f"{n}{unit}"
    if n * scale > 3600 or (unit == "" and n != 0):
        with pytest.raises(ConfigError):
            parse_duration(text, "schedule.global_rate")
    else:
        assert parse_duration(text, "schedule.global_rate") == pytest.approx(n * scale)


@settings(max_examples=400, deadline=None)
@given(value=any_value, lo=st.floats(-1e6, 0), hi=st.floats(0, 1e6))
def test_check_number_is_finite_within_bounds_or_config_error(value: Any, lo: float, hi: float) -> None:
    """The one number validator returns a finite float in [lo, hi] or raises ConfigError, nothing else."""
    try:
        got = check_number(value, "k", lo, hi)
    except ConfigError as e:
        assert str(e).startswith("k: ") and len(str(e)) < 400
        return
    assert math.isfinite(got) and lo <= got <= hi


@settings(max_examples=400, deadline=None)
@given(raw=st.one_of(st.text(max_size=30), duration_text), name=st.sampled_from(sorted(ENV_NUMBERS)))
@example(raw="nan", name="POLITEPROXY_RATE_WINDOW")
@example(raw="-inf", name="POLITEPROXY_CLOCK_OFFSET")
@example(raw="1e400", name="POLITEPROXY_CLOCK_OFFSET")
def test_env_numbers_are_finite_bounded_or_config_error(raw: str, name: str) -> None:
    """A numeric environment variable reads as a finite number within its bounds, or a ConfigError
    naming the variable."""
    lo, hi, _default = ENV_NUMBERS[name]
    try:
        got = env_number({name: raw}, name)
    except ConfigError as e:
        assert str(e).startswith(f"{name}: ")
        return
    assert math.isfinite(got) and lo <= got <= hi


def test_parse_number_reads_signed_decimals() -> None:
    """Signed decimals are numbers; exponents, nan and inf are not."""
    assert parse_number("-5.5", "k", -10, 10) == -5.5
    assert parse_number(" 60 ", "k", 0, 100) == 60.0
    for bad in ("nan", "1e3", "inf", "", "--1", "0x10"):
        with pytest.raises(ConfigError):
            parse_number(bad, "k", -10, 10)


@settings(max_examples=300, deadline=None)
@given(
    section=st.sampled_from(["client", "upstream", "pacing", "robots", "schedule"]),
    value=any_value,
)
def test_build_never_accepts_a_non_finite_number(section: str, value: Any) -> None:
    """Whatever value any key of a section gets, build() either refuses it with a ConfigError or every
    number in the resulting config is finite and non-negative."""
    from politeproxy.config.loading import SCHEMA

    for key in SCHEMA[section]:
        try:
            cfg = build({section: {key: value}})
        except ConfigError:
            continue
        for v in cfg[section].values():
            if isinstance(v, float):
                assert math.isfinite(v) and v >= 0, (section, key, value, v)


# -- Retry-After ------------------------------------------------------------------------------------

retry_after_text = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="-0123456789 ²\u0661e.+", max_size=20),
    st.from_regex(r"-{0,3}[0-9]{1,6000}", fullmatch=True),
    st.builds(
        "{}, {:02d} {} {} {:02d}:{:02d}:{:02d} {}".format,
        st.sampled_from(["Mon", "Tue", "Xyz", ""]),
        st.integers(-5, 99),
        st.sampled_from(["Jan", "Feb", "Dec", "Foo"]),
        st.integers(-99999, 999999),
        st.integers(0, 99),
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from(["GMT", "UTC", "+0000", "-2400", "+9999", ""]),
    ),
)


@pytest.mark.slow  # 1,500 hypothesis examples: ~4-9 s
@settings(max_examples=1500, deadline=None)
@given(value=st.one_of(retry_after_text, st.none()))
@example(value="--5")
@example(value="²")
@example(value="1e999")
@example(value="9" * 5000)
@example(value="a\x00b")
@example(value="Mon, 01 Jan 99999 00:00:00 GMT")
@example(value="Fri, 31 Dec 9999 23:59:59 GMT")
@example(value="Mon, 01 Jan 0001 00:00:00 GMT")
def test_parse_retry_after_never_raises_and_is_finite(value: str | None) -> None:
    """parse_retry_after never raises on any string and returns None or a finite number of seconds in
    [0, RETRY_AFTER_MAX]."""
    got = parse_retry_after(value, NOW)
    assert got is None or (math.isfinite(got) and 0.0 <= got <= RETRY_AFTER_MAX)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=0, max_value=10**12))
def test_parse_retry_after_reads_delta_seconds_capped(n: int) -> None:
    """A delta-seconds value reads as itself, capped at RETRY_AFTER_MAX."""
    assert parse_retry_after(str(n), NOW) == min(float(n), RETRY_AFTER_MAX)


@settings(max_examples=200, deadline=None)
@given(now=st.floats(allow_nan=True, allow_infinity=True))
def test_parse_retry_after_with_any_clock(now: float) -> None:
    """Even a broken clock value gives None or a finite, non-negative wait."""
    for value in ("Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 2024 00:00:00 GMT", "120"):
        got = parse_retry_after(value, now)
        assert got is None or (math.isfinite(got) and 0.0 <= got <= RETRY_AFTER_MAX)


def test_parse_retry_after_date_is_seconds_from_now() -> None:
    """An HTTP-date reads as the seconds from now (the ordinary case still works)."""
    from email.utils import formatdate

    assert parse_retry_after(formatdate(time.time() + 90, usegmt=True), time.time()) == pytest.approx(
        90, abs=2
    )


# -- host names -------------------------------------------------------------------------------------

BAD_CHARS = ("/", "\\", "\x00", "..")
host_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abc019-._/\\\x00 \n\t*[]:K\u212a\u0130", max_size=40).map(
        lambda s: s + ".commoncrawl.org"
    ),
    st.from_regex(r"[a-z0-9-]{1,70}(\.[a-z0-9-]{1,70}){1,5}", fullmatch=True),
)


@pytest.mark.slow  # 1,500 hypothesis examples: ~5-12 s
@settings(max_examples=1500, deadline=None)
@given(raw=host_text)
@example(raw="a\n.commoncrawl.org")
@example(raw="../../x.commoncrawl.org")
@example(raw="/etc/x.commoncrawl.org")
@example(raw="a..commoncrawl.org")
@example(raw="\u212a.commoncrawl.org")
def test_normalize_host_never_raises_and_valid_names_are_safe(raw: str) -> None:
    """normalize_host never raises on a string; a name valid_hostname accepts (raw or normalized) holds
    no '/', '\\\\', '..', NUL or whitespace, is at most 253 characters, and is already normalized."""
    name = normalize_host(raw)
    assert isinstance(name, str)
    assert normalize_host(raw.encode(errors="replace")) == ""  # type: ignore[arg-type]  # not a str: ""
    for candidate in (raw, name):
        if valid_hostname(candidate):
            assert not any(bad in candidate for bad in BAD_CHARS), candidate
            assert not any(c.isspace() for c in candidate), candidate
            assert candidate.isascii() and len(candidate) <= 253
            assert normalize_host(candidate) == candidate


@pytest.mark.slow  # 600 hypothesis examples, each building a config: ~2-4 s
@settings(max_examples=600, deadline=None)
@given(raw=host_text)
@example(raw="a\n.commoncrawl.org")
@example(raw="a_b.commoncrawl.org")
def test_config_host_patterns_are_valid_names(raw: str) -> None:
    """A pattern validate_pattern accepts is a valid host name once its one '*' label is replaced, and a
    config with it in paced_hosts builds; one it refuses is a ConfigError naming paced_hosts[0]."""
    err = validate_pattern(raw)
    if err is None:
        assert valid_hostname(normalize_host(raw).replace("*", "x"))
        build({"paced_hosts": [raw]})
    else:
        with pytest.raises(ConfigError, match=r"^paced_hosts\[0\]: "):
            build({"paced_hosts": [raw]})
