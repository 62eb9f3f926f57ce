"""When the proxy retries a throttled request on the client's behalf (policy core, no I/O, no clock).

The rules, as a table; ``Permit.retry`` (pacing/permit.py) applies them with the pacer's settings and clock,
and the forwarder asks the permit:

- only GET and HEAD without a body are replayed (a POST may have had an effect upstream);
- only after a throttle (``delay`` is the backoff the pacer applied; None: the answer was no throttle);
- never after a block (``blocked``: a 403, or the third connection failure in a row): every request sent
  during a CloudFront rate-rule window prolongs it, so the block goes back to the client at once;
- never more than ``retries_left`` times;
- always after the delay, whatever the request's class: an exempt read that skips the schedule still
  waits out the host's Retry-After before trying again (never "at once"), and never sooner than
  ``MIN_RETRY_GAP`` ("retrying no more than once per second is polite enough");
- only when the wait still fits the request's ``max_wait`` (measured from its arrival); otherwise the
  upstream's own throttle answer goes back to the client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REPLAYABLE = frozenset({"GET", "HEAD"})
MIN_RETRY_GAP = 1.0  # seconds; Common Crawl's status page: once per second is polite enough


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    after: float = 0.0  # seconds to wait before taking the next permit (finite, >= 0)
    why: str = ""


def _finite(x: float) -> float | None:
    return x if isinstance(x, int | float) and math.isfinite(x) and x >= 0 else None


def decide_retry(
    method: str,
    has_body: bool,
    retries_left: int,
    elapsed: float,
    delay: float | None,
    max_wait: float,
    blocked: bool = False,
) -> RetryDecision:
    """Retry or not, and after how long. Never raises; any non-finite or negative input means no retry."""
    if method.upper() not in REPLAYABLE or has_body:
        return RetryDecision(False, why="not replayable")
    if blocked:
        return RetryDecision(False, why="a block is never retried")
    if delay is None:
        return RetryDecision(False, why="not a throttle")
    if retries_left <= 0:
        return RetryDecision(False, why="no retries left")
    d, el, mw = _finite(delay), _finite(elapsed), _finite(max_wait)
    if d is None or el is None or mw is None:
        return RetryDecision(False, why="invalid timing")
    after = max(d, MIN_RETRY_GAP)
    if el + after >= mw:
        return RetryDecision(False, why="would exceed max_wait")
    return RetryDecision(True, after=after, why="throttled")
