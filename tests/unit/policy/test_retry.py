"""The pure retry decision (policy/retry.py): a table of cases, and a property over any input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.retry import MIN_RETRY_GAP, decide_retry

MW = 25.0

# method, has_body, retries_left, elapsed, delay, max_wait -> retry?, after
CASES = [
    ("GET", False, 2, 0.0, 5.0, MW, True, 5.0),  # the delay is applied: never at once
    ("HEAD", False, 1, 3.0, 2.0, MW, True, 2.0),
    ("get", False, 1, 0.0, 2.0, MW, True, 2.0),  # method case does not matter
    ("GET", False, 2, 0.0, 0.0, MW, True, MIN_RETRY_GAP),  # Retry-After: 0 still waits a second
    ("GET", False, 2, 0.0, 0.2, MW, True, MIN_RETRY_GAP),
    ("GET", False, 2, 0.0, None, MW, False, 0.0),  # not a throttle
    ("GET", False, 0, 0.0, 5.0, MW, False, 0.0),  # no retries left
    ("GET", False, -1, 0.0, 5.0, MW, False, 0.0),
    ("GET", True, 2, 0.0, 5.0, MW, False, 0.0),  # a body is never replayed
    ("POST", False, 2, 0.0, 1.0, MW, False, 0.0),
    ("PUT", False, 2, 0.0, 1.0, MW, False, 0.0),
    ("GET", False, 2, 20.0, 5.0, MW, False, 0.0),  # exactly max_wait: does not fit
    ("GET", False, 2, 19.9, 5.0, MW, True, 5.0),
    ("GET", False, 2, 0.0, 30.0, MW, False, 0.0),  # Retry-After beyond max_wait
    ("GET", False, 2, 0.0, math.nan, MW, False, 0.0),  # nan would pass every "x < y" test: refused
    ("GET", False, 2, 0.0, math.inf, MW, False, 0.0),
    ("GET", False, 2, 0.0, -1.0, MW, False, 0.0),
    ("GET", False, 2, math.nan, 1.0, MW, False, 0.0),
    ("GET", False, 2, 0.0, 1.0, math.inf, False, 0.0),
    ("GET", False, 2, 0.0, 1.0, math.nan, False, 0.0),
]


@pytest.mark.parametrize(("method", "body", "left", "elapsed", "delay", "mw", "retry", "after"), CASES)
def test_retry_table(
    method: str,
    body: bool,
    left: int,
    elapsed: float,
    delay: float | None,
    mw: float,
    retry: bool,
    after: float,
) -> None:
    d = decide_retry(method, body, left, elapsed, delay, mw)
    assert (d.retry, d.after) == (retry, after), d


times = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@pytest.mark.parametrize("delay", [0.0, 1.0, 5.0, 120.0, None])
def test_a_block_is_never_retried(delay: float | None) -> None:
    """A block (403, or the third connection failure in a row) goes back to the client, whatever else."""
    d = decide_retry("GET", False, 2, 0.0, delay, 1e6, blocked=True)
    assert not d.retry and d.after == 0.0


@given(
    st.text(max_size=8),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    times,
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
def test_retry_decision_is_total_and_bounded(
    method: str, body: bool, left: int, elapsed: float, delay: float | None, mw: float, blocked: bool
) -> None:
    """For any input the decision never raises; a retry waits a finite time, at least the delay and
    MIN_RETRY_GAP, and the wait ends before max_wait (counted from the request's arrival); a block is
    never retried."""
    d = decide_retry(method, body, left, elapsed, delay, mw, blocked)
    assert not (blocked and d.retry)
    assert math.isfinite(d.after) and d.after >= 0
    if d.retry:
        assert delay is not None and d.after >= delay and d.after >= MIN_RETRY_GAP
        assert elapsed + d.after < mw
        assert left > 0 and not body and method.upper() in ("GET", "HEAD")
