"""Retry-After parsing and adaptive backoff (policy core, no I/O)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from enum import IntEnum

from politeproxy.policy.slots import HostState, adaptive_interval
from politeproxy.policy.table import Sections, default, from_table, table_values

# Why these: 429 and 503 are the standard "slow down", short-lived (S3's SlowDown reaches clients as 503
# or wrapped in a 500): exponential backoff is right. A 403 from CloudFront on data.commoncrawl.org is a
# rate-rule block (Common Crawl's downloader calls it unrecoverable; a WAF window runs 1 to 10 minutes and
# every request sent in it prolongs it): a long hold, then one probe. A 404 or 416 is an ordinary answer.
DEFAULT_THROTTLE_CODES: frozenset[int] = frozenset(default("pacing.throttle_codes"))
DEFAULT_BLOCK_CODES: frozenset[int] = frozenset(default("pacing.block_codes"))
FAIL_BLOCK = 3  # connection failures in a row from one host count as a block (pywb drops connections)


class Kind(IntEnum):
    """What an answer says about the host (the numbers are the Lua script's argument)."""

    THROTTLE = 0  # 429/500/503: exponential backoff
    BLOCK = 1  # 403: hold for block_hold, doubling, then one probe
    FAILURE = 2  # no answer (connect failure, reset, empty reply): a throttle, FAIL_BLOCK in a row a block


@dataclass(frozen=True)
class BackoffPolicy:
    """How long a host rests after a throttle or a block: [pacing]'s backoff, block and adaptive keys."""

    base: float = from_table("pacing.backoff_base")
    factor: float = 2.0  # not a config key
    cap: float = from_table("pacing.backoff_cap")
    jitter: float = from_table("pacing.backoff_jitter")  # a delay grows by up to this fraction, not past cap
    # the first hold after a block, doubled per consecutive block up to block_hold_cap
    block_hold: float = from_table("pacing.block_hold")
    block_hold_cap: float = from_table("pacing.block_hold_cap")
    adaptive: bool = from_table("pacing.adaptive")  # a throttle or block raises the host's interval (AIMD)
    adaptive_floor: float = from_table("pacing.adaptive_floor")  # the raised interval is at least this
    # from the end of the backoff, back to the configured interval over this
    adaptive_recovery: float = from_table("pacing.adaptive_recovery")

    @classmethod
    def of(cls, sections: Sections) -> BackoffPolicy:
        """The policy of ``sections``; the longest hold is at least the first."""
        b = cls(**table_values(cls, sections))
        return replace(b, block_hold_cap=max(b.block_hold, b.block_hold_cap))


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
    block: bool = False  # the answer was (or completed) a block: never retried


def throttle_delay(throttles: int, retry_after: float | None, policy: BackoffPolicy, rand: float) -> Delay:
    """How long a host rests after a throttle (``throttles`` before this one; ``rand`` in [0, 1))."""
    if retry_after is not None:
        if retry_after > policy.cap:
            return Delay(policy.cap, capped_from=retry_after)
        return Delay(retry_after)
    exp = min(throttles, 64)  # 2**64 s is already far beyond any cap
    raw = policy.base * math.pow(policy.factor, exp)
    return Delay(min(policy.cap, raw * (1.0 + policy.jitter * rand)))


def block_delay(blocks: int, retry_after: float | None, policy: BackoffPolicy) -> Delay:
    """The hold after a block (``blocks`` before this one): block_hold doubled per consecutive block up to
    block_hold_cap; a Retry-After wins where it asks for longer (cut at the longer of the two caps)."""
    hold = min(policy.block_hold_cap, policy.block_hold * math.pow(2.0, min(blocks, 64)))
    if retry_after is None or retry_after <= hold:
        return Delay(hold, block=True)
    top = max(policy.cap, policy.block_hold_cap)
    if retry_after > top:
        return Delay(top, capped_from=retry_after, block=True)
    return Delay(retry_after, block=True)


def raised_interval(state: HostState, now: float, base: float, policy: BackoffPolicy) -> float:
    """AIMD: the effective interval after a throttle at least doubles (from the configured ``base`` when
    nothing is raised), never below adaptive_floor; cut at the backoff cap (an interval longer than the
    longest backoff would be a block)."""
    cur = max(base, adaptive_interval(state, now, base))
    return max(policy.adaptive_floor, min(max(policy.cap, policy.adaptive_floor), 2.0 * cur))


def answer_delay(
    state: HostState, kind: Kind, retry_after: float | None, policy: BackoffPolicy, rand: float
) -> Delay:
    """The delay a throttle, block or failure earns (a FAIL_BLOCK-th failure in a row is a block)."""
    if kind is Kind.BLOCK or (kind is Kind.FAILURE and state.fails + 1 >= FAIL_BLOCK):
        return block_delay(state.blocks, retry_after, policy)
    return throttle_delay(state.throttles, retry_after, policy, rand)


def apply_answer(
    state: HostState, now: float, kind: Kind, delay: Delay, base: float, policy: BackoffPolicy
) -> HostState:
    """Record a throttle/block/failure with its delay: backoff, counts, the probe back out, and the raised
    interval stepping down from the end of the backoff (``base``: the configured interval)."""
    until = max(state.backoff_until, now + delay.seconds)
    fails = 0 if delay.block or kind is not Kind.FAILURE else state.fails + 1
    new = replace(
        state,
        backoff_until=until,
        throttles=state.throttles + 1,
        blocks=state.blocks + 1 if delay.block else state.blocks,
        fails=fails,
        probe_until=0.0,
    )
    if policy.adaptive:
        raised = raised_interval(state, now, base, policy)
        new = replace(
            new, adapt_interval=raised, adapt_from=until, adapt_until=until + policy.adaptive_recovery
        )
    return new


def apply_throttle(state: HostState, now: float, delay: float) -> HostState:
    return replace(state, backoff_until=max(state.backoff_until, now + delay), throttles=state.throttles + 1)


def apply_success(state: HostState, now: float = math.inf) -> HostState:
    """A non-throttle answer: the counts reset; the block ends only once its hold is over (an answer to a
    request sent before the block must not skip the probe)."""
    new = replace(state, throttles=0, fails=0)
    if state.blocks and state.backoff_until <= now:
        new = replace(new, blocks=0, probe_until=0.0)
    return new if new != state else state


def retry_after_seconds(wait: float) -> int:
    """The Retry-After to send for a wait: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait))
