"""Retry-After parsing and adaptive backoff (policy core, no I/O)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime

from politeproxy.policy.slots import HostState

# Why these: 429 and 503 are the standard "slow down"; Common Crawl's CloudFront rate rules answer 403,
# and S3's SlowDown reaches clients as 503 or wrapped in a 500. A 404 or 416 is an ordinary answer.
DEFAULT_THROTTLE_CODES: frozenset[int] = frozenset({403, 429, 500, 503})


@dataclass(frozen=True)
class BackoffPolicy:
    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.2  # a delay grows by up to this fraction, never beyond the cap


# The longest Retry-After taken at its word; a longer one (or a date years ahead) is cut to this. The
# pacer cuts again at backoff_cap, and logs the value it cut.
RETRY_AFTER_MAX = 86400.0
_MAX_HEADER = 128  # an HTTP-date is 29 characters; anything much longer is not a Retry-After


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP-date); None when invalid.

    Never raises, whatever the upstream sent; the result is finite, >= 0 and <= RETRY_AFTER_MAX.
    A negative delta ("-5") means now; "--5", "1.5", "²" and other non-ASCII digits are invalid.
    """
    if not isinstance(value, str) or not math.isfinite(now):
        return None
    value = value.strip()
    if not value:
        return None
    digits = value[1:] if value[0] == "-" else value
    if digits.isascii() and digits.isdigit():
        if value[0] == "-":
            return 0.0
        # Compare as text first: int() refuses more than 4300 digits, and 10 digits already exceed the cap.
        return RETRY_AFTER_MAX if len(digits) > 9 else min(RETRY_AFTER_MAX, float(int(digits)))
    if len(value) > _MAX_HEADER:
        return None
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:  # the asctime form carries no zone; every HTTP-date is in GMT
            when = when.replace(tzinfo=dt.UTC)
        delay = when.timestamp() - now
    except (TypeError, ValueError, IndexError, OverflowError, AttributeError):
        return None
    if not math.isfinite(delay):
        return None
    return min(RETRY_AFTER_MAX, max(0.0, delay))


@dataclass(frozen=True)
class Delay:
    seconds: float
    capped_from: float | None = None  # the Retry-After the cap cut, for the log


def throttle_delay(throttles: int, retry_after: float | None, policy: BackoffPolicy, rand: float) -> Delay:
    """How long a host rests after a throttle (``throttles`` before this one; ``rand`` in [0, 1))."""
    if retry_after is not None:
        if retry_after > policy.cap:
            return Delay(policy.cap, capped_from=retry_after)
        return Delay(retry_after)
    exp = min(throttles, 64)  # 2**64 s is already far beyond any cap
    raw = policy.base * math.pow(policy.factor, exp)
    return Delay(min(policy.cap, raw * (1.0 + policy.jitter * rand)))


def apply_throttle(state: HostState, now: float, delay: float) -> HostState:
    return replace(state, backoff_until=max(state.backoff_until, now + delay), throttles=state.throttles + 1)


def apply_success(state: HostState) -> HostState:
    return replace(state, throttles=0) if state.throttles else state


def retry_after_seconds(wait: float) -> int:
    """The Retry-After to send for a wait: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait))
