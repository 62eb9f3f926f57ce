"""Issue 12 in the pacer: the exempt ceiling's wait, and what the proxy tells a client about a resting host.

Kept apart from pacer.py so the facade stays small: ``exempt_slot`` waits for a GCRA slot (shared through
the store) and out the host's backoff, block or probe; ``RestNotes`` remembers, per host and bounded, what
rests it and until when, for the body of the proxy's own refusals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from politeproxy.pacing.base import PacingSettings, WaitTooLong, window_full
from politeproxy.policy.backoff import Delay, Kind
from politeproxy.policy.indexanswers import index_rest, is_warning
from politeproxy.policy.services import INDEX, service_key, service_of
from politeproxy.policy.settings import format_utc
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.stores.base import Store


def is_index_warning(host: str, status: int | None, s: PacingSettings) -> bool:
    """A warning from the index server (502, 503, 504, or no answer) while its rest is on (issue 43)."""
    return s.index_rest > 0 and is_warning(status) and service_of(host) == INDEX


async def index_rested(
    store: Store, host: str, retry_after: float | None, delay: Delay, s: PacingSettings, reason: str
) -> tuple[Delay, str]:
    """The index service's rest after a warning (issue 43): the longest of ``index_rest`` (doubled per
    warning in a row, as the store counts them), Retry-After and the backoff the store just applied
    (``delay``). Pushed into the store's record of the host (``mirror_backoff``), so every proxy sharing
    the store rests it as it would a hold; a store fault leaves the local hold alone to keep it."""
    try:
        warnings = (await store.host_view(host)).throttles
    except Exception:  # noqa: BLE001 - counted as the first: the rest is at least index_rest
        warnings = 1
    cap = max(s.backoff.cap, s.index_rest)
    rest = index_rest(s.index_rest, retry_after, delay.seconds, warnings, cap)
    if rest > delay.seconds:
        try:
            await store.mirror_backoff(host, rest)
        except Exception:  # noqa: BLE001, S110 - the local hold still rests this proxy
            pass
        delay = Delay(rest, delay.capped_from)
    return delay, f"{reason}: the index server rests {rest:.0f}s"


class RestNotes:
    """host -> (block or backoff, since, until as wall-clock times, why); at most ``cap`` hosts, the oldest
    dropped. A rest this proxy recorded, or one another proxy noted in the store (``adopt``): every refusal
    during one rest says the same thing, whichever proxy or worker refused it (issue 41)."""

    def __init__(self, cap: int, clock: Callable[[], float] = time.time) -> None:
        self.cap = cap
        self.clock = clock
        self._hosts: dict[str, tuple[Kind, float, float, str]] = {}

    def remember(self, host: str, kind: Kind, seconds: float, reason: str = "") -> None:
        now = self.clock()
        self.adopt(host, kind, now, now + seconds, reason)

    def adopt(self, host: str, kind: Kind, since: float, until: float, reason: str) -> None:
        self._hosts.pop(host, None)
        self._hosts[host] = (kind, since, until, reason)
        while len(self._hosts) > self.cap:
            del self._hosts[next(iter(self._hosts))]

    def forget(self, host: str) -> None:
        self._hosts.pop(host, None)

    def until(self, host: str) -> float:
        """Until when (wall clock) ``host`` rests; 0 when it does not."""
        _, _, until, _ = self._hosts.get(host, (Kind.THROTTLE, 0.0, 0.0, ""))
        return until if until > self.clock() else 0.0

    def note(self, host: str) -> str:
        """ "<host> is blocked until <UTC> (since <UTC>: <why>)" (or "backing off"), or "" when it does
        not rest: the whole reason of a refusal while it rests."""
        kind, since, until, why = self._hosts.get(host, (Kind.THROTTLE, 0.0, 0.0, ""))
        if until <= self.clock():
            return ""
        state = "blocked" if kind is Kind.BLOCK else "backing off"
        text = f"{host} is {state} until {format_utc(until)} (since {format_utc(since)}"
        return f"{text}: {why})" if why else f"{text})"

    def reasons(self) -> dict[str, str]:
        """host -> why this proxy last held it ("403 from CloudFront (Server: CloudFront)"), for /status."""
        return {h: r for h, (_, _, _, r) in self._hosts.items() if r}


async def exempt_slot(
    store: Store,
    s: PacingSettings,
    host: str,
    deadline: float,
    monotonic: Callable[[], float],
    local_ready: Callable[[], float],
    on_error: Callable[[BaseException], None],
) -> float:
    """Wait for the exempt slot of the host's service (one ceiling for every name of the bucket, issue 24);
    return 0, or raise WaitTooLong (with the wait) when it would come after ``deadline`` (monotonic). The
    host's own backoff, block and probe hold the read. ``exempt.respect_backoff = false``: the ceiling
    only (and with ``exempt.rate = 0`` no store call at all).
    A store that cannot answer is reported to ``on_error``; the local hint (``local_ready``) then holds."""
    hold = s.exempt_respect_backoff
    window = s.window_for(host)
    if not hold and s.exempt_rate <= 0 and window is None:
        return 0.0
    ceiling = service_key(host)
    saw_window = False  # the window held this read once: a refusal names it
    while True:
        now = monotonic()
        try:
            left = max(0.0, deadline - now)
            c = await store.exempt_claim(host, s.exempt_rate, s.exempt_burst, left, hold, ceiling, window)
        except Exception as e:  # noqa: BLE001 - a store fault must not turn an exempt read into a 500
            on_error(e)
            wait = max(0.0, local_ready() - now) if hold else 0.0
            c = Claim(Outcome.HOST_NOT_READY if wait > 0 else Outcome.GRANTED, wait, 0.0)
        saw_window = saw_window or c.window
        # A slot granted now goes even when the wait for a place used the whole max_wait: it is counted.
        if c.outcome is Outcome.TOO_LATE or (c.wait > 0 and now + c.wait > deadline):
            why = window_full(s, host, c.wait) if saw_window else ""
            raise WaitTooLong(c.wait, why or f"{host} would wait {c.wait:.1f}s for an exempt read")
        if c.wait > 0:
            await asyncio.sleep(c.wait)
        if c.granted:
            return 0.0
