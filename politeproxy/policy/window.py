"""The request window Common Crawl enforces, kept per egress and service (policy core, no I/O).

Common Crawl's WAF blocks an IP that sends more than 6,000 requests in any 300 s, all kinds together
(DESIGN.md, "Facts about the far side"). The proxy counts every request it lets go to a service in a
trailing window of ``seconds`` and lets one more go at time ``t`` only when no window holding ``t`` would
then hold more than ``limit``.

The count is kept in ``BUCKETS`` buckets per window (each ``seconds / BUCKETS`` wide), so a record stays
small whatever the rate: its buckets lie between one ``reach`` before now and ``AHEAD`` buckets after it.
The check is conservative: every bucket that reaches into ``(t - reach, +inf)`` counts in full, slots
reserved for later included, so no trailing window ever holds more than ``limit`` requests, even of
arrivals up to LATE after their slots; the price is one bucket's share of the window, plus LATE.

Use (every store does this inside the one critical section of a claim)::

    state = live(state, now, rule)              # stale buckets dropped
    c, new = gate(claim, now, state, rule, deadline)
    if new is not None: write(new)              # granted: the request is counted at its slot
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from politeproxy.policy.slots import Claim, Outcome

BUCKETS = 50  # per window: 6 s buckets for Common Crawl's 300 s
AHEAD = 2 * BUCKETS  # a slot at most this many buckets past now is counted; a later one waits
MAX_KEPT = 2 * BUCKETS + AHEAD + 2  # buckets a sane record holds at most (its reach, then AHEAD)
MAX_COUNT = 10_000_000  # requests one bucket may claim to hold (a record holding more is corrupt)
EPSILON = 1e-6  # past a bucket's edge, so the next look finds it out of the window (float rounding)
SAME_WIDTH = 1e-9  # widths this close are one: a record keeps its width in whole nanoseconds
# Common Crawl counts arrivals, the store counts slots: a request leaves a little after its slot (the event
# loop, the upstream connection; on a loaded 2-core box up to about a second). So a slot counts for the
# windows of requests up to ``seconds + LATE`` after it (a window under LATE: twice the window), so a
# request that late never overfills one. Against 300 s it costs a third of a percent of the limit.
LATE = 1.0


@dataclass(frozen=True, slots=True)
class WindowRule:
    """One service's window: at most ``limit`` requests in any ``seconds`` (``limit`` 0: no window).

    ``service`` names the record (``policy.services.service_key``); ``egress`` the IP's name that Common
    Crawl counts (``[egress] name``): the shared store keeps one record per egress and service."""

    service: str
    egress: str
    seconds: float
    limit: int

    @property
    def on(self) -> bool:
        return self.limit > 0 and self.seconds > 0

    @property
    def width(self) -> float:
        return self.seconds / BUCKETS

    @property
    def reach(self) -> float:
        """How long after its slot a request still counts for the next ones: the window, plus LATE."""
        return self.seconds + min(LATE, self.seconds)


@dataclass(frozen=True, slots=True)
class WindowState:
    """The counts of one window: ``(bucket, count)`` pairs, bucket ``floor(t / width)``, ascending."""

    width: float = 0.0
    buckets: tuple[tuple[int, int], ...] = ()
    # Made here (by live or record), not read from a record: its buckets need no check (the hot path).
    checked: bool = field(default=False, compare=False)

    def total(self) -> int:
        return sum(c for _, c in self.buckets)


def _index(t: float, width: float) -> int:
    return math.floor(t / width)


def live(state: WindowState, now: float, rule: WindowRule) -> tuple[WindowState, bool]:
    """The state with buckets no later look can count dropped, and whether the record was sane.

    A record kept at another width (the window was changed) has all its counts moved to the end of its
    newest bucket: they then last at least as long as they should. (One limit: a narrower window keeps
    buckets only AHEAD of its own width ahead of now, so slots reserved further ahead than twice the new
    window stand at its furthest bucket instead, and leave the window that much early. Slots are reserved at
    most ``pacing.max_wait`` ahead, 25 s by default.) A record that is not sane (a bucket beyond AHEAD, a
    count beyond MAX_COUNT, not in order) is bounded the same way; it holds the service for at most one
    window more, never longer. A width within SAME_WIDTH of the rule's is the rule's: the file record
    keeps whole nanoseconds, and 7.3 s / 50 does not round-trip through them."""
    w = rule.width
    lo = _index(now - rule.reach, w)
    hi = _index(now, w) + AHEAD
    same = abs(state.width - w) <= SAME_WIDTH  # False for NaN
    bad = False  # a fault of the buckets themselves, whatever the width
    prev = -(2**63) - 1
    for i, c in () if state.checked else state.buckets:  # a record read back: checked in one pass
        if not (0 < c <= MAX_COUNT) or i <= prev:
            bad = True
            break
        prev = i
    b = state.buckets
    if (same or not b) and not bad and (not b or b[-1][0] <= hi):
        if not b or b[0][0] >= lo:  # nothing left the window
            return (state if state.checked and state.width == w else WindowState(w, b, True)), True
        return WindowState(w, tuple(x for x in b if x[0] >= lo), True), True
    # A width change is legitimate (a reload) when the old width is a width and the buckets are sound.
    legit = not same and not bad and math.isfinite(state.width) and state.width > 0
    total = min(MAX_COUNT, sum(min(max(0, c), MAX_COUNT) for _, c in state.buckets))
    old_w = state.width if math.isfinite(state.width) and state.width > 0 else w
    newest = max(i for i, _ in state.buckets)
    end = min((newest + 1) * old_w, (hi + 1) * w)  # the latest time any of them may stand for
    if total <= 0 or end <= now - rule.reach:
        return WindowState(w, ()), legit  # all of it stale: a reload is no fault, a stray record is
    at = max(lo, min(hi, _index(end, w)))
    return WindowState(w, ((at, total),)), legit


def wait(state: WindowState, t: float, now: float, rule: WindowRule) -> float:
    """0 when one more request may go at ``t``; else seconds from ``now`` until it is worth asking again
    (the earliest time one could go). ``state`` is live."""
    if not rule.on:
        return 0.0
    w = rule.width
    if (ti := _index(t, w)) > _index(now, w) + AHEAD:  # too far ahead to count: wait until it is not
        return max(EPSILON, (ti - AHEAD) * w - now + EPSILON)
    lo = _index(t - rule.reach, w)
    b = state.buckets
    total, start = 0, len(b)
    while start > 0 and b[start - 1][0] >= lo:  # from the newest back: live states hold few older ones
        start -= 1
        total += b[start][1]
    if total < rule.limit:
        return 0.0
    for i, c in b[start:]:  # ascending: the oldest bucket leaves the window first
        total -= c
        if total < rule.limit:
            return max(EPSILON, (i + 1) * w + rule.reach - now + EPSILON)
    return max(EPSILON, t + rule.reach - now)  # a limit of 0 never gets here (``on``)


def record(state: WindowState, t: float, rule: WindowRule) -> WindowState:
    """``state`` with one request counted at ``t``."""
    i = _index(t, rule.width)
    b = state.buckets
    if b and b[-1][0] == i:  # the usual cases first: the newest bucket, or a new one after it
        return WindowState(rule.width, (*b[:-1], (i, b[-1][1] + 1)), True)
    if not b or b[-1][0] < i:
        return WindowState(rule.width, (*b, (i, 1)), True)
    counts = dict(b)
    counts[i] = counts.get(i, 0) + 1
    return WindowState(rule.width, tuple(sorted(counts.items())), True)


def gate(
    c: Claim, now: float, state: WindowState, rule: WindowRule | None, deadline: float | None = None
) -> tuple[Claim, WindowState | None]:
    """A claim passed through the window: granted, the claim and the window with its slot counted;
    else a claim that reserves nothing (``window=True``: the window is why) and None. ``state`` is live."""
    if rule is None or not rule.on or not c.granted:
        return c, None
    if (later := wait(state, c.at, now, rule)) > 0:
        at = max(c.at, now + later)
        late = deadline is not None and at > deadline
        outcome = Outcome.TOO_LATE if late else Outcome.HOST_NOT_READY
        return Claim(outcome, at - now, at, window=True), None
    return c, record(state, c.at, rule)


def used(state: WindowState, now: float, rule: WindowRule) -> int:
    """Requests the window holds now (slots reserved for later included): what status shows."""
    lo = _index(now - rule.seconds, rule.width)
    return sum(c for i, c in state.buckets if i >= lo)


def divided(rule: WindowRule | None, n: float) -> WindowRule | None:
    """The rule one of ``n`` proxies keeps alone while the shared store is down (at least 1 request)."""
    if rule is None or not rule.on or n <= 1:
        return rule
    return WindowRule(rule.service, rule.egress, rule.seconds, max(1, int(rule.limit // n)))


# -- carrying a window across stores and clocks (stores/window_mirror.py, stores/file_windows.py) -----------
#
# Stores keep their windows on different clocks (memory: monotonic, file: wall, Redis: the server's), so a
# window crosses from one store to another as relative times: each bucket's end, in seconds from now.

Relative = tuple[tuple[float, int], ...]  # (bucket end - now, count), ascending


def relative(state: WindowState, now: float, rule: WindowRule) -> Relative:
    """The live buckets of ``state`` as (end - now, count): what another store needs to count them."""
    w = rule.width
    return tuple(((i + 1) * w - now, c) for i, c in state.buckets if c > 0)


ALIGN = 1e-3  # of a bucket: a relative end this close past a bucket's end is that bucket's (float rounding)


def merged(
    state: WindowState, counts: Relative, now: float, rule: WindowRule, add: bool = False
) -> WindowState:
    """``state`` (live) holding at least ``counts`` too, each in the bucket whose end is at or after the
    count's end (so a count lasts at least as long as it did where it came from, less ALIGN of a bucket;
    misaligned bucket grids cost at most one bucket). ``counts`` landing in one bucket add up; then per
    bucket the larger of that and ``state``'s count: the same requests arriving by two ways (this proxy's
    own grants and the shared store's snapshot) are not counted twice when their buckets align, and are
    counted twice (the safe side) when they do not. ``add``: added to ``state``'s instead (requests
    ``state`` never saw). Counts outside the window's span are dropped or moved to its furthest bucket, as
    ``live`` bounds a record."""
    w = rule.width
    lo = _index(now - rule.reach, w)
    hi = _index(now, w) + AHEAD
    more: dict[int, int] = {}
    for rel, c in counts:
        if not (math.isfinite(rel) and 0 < c):
            continue
        i = min(hi, math.ceil((now + rel) / w - ALIGN) - 1)
        if i >= lo:
            more[i] = min(MAX_COUNT, more.get(i, 0) + c)
    out = dict(state.buckets)
    for i, c in more.items():
        out[i] = min(MAX_COUNT, out.get(i, 0) + c) if add else max(out.get(i, 0), c)
    return WindowState(w, tuple(sorted(out.items())), True)


def full(rule: WindowRule) -> Relative:
    """The counts of a window taken to be full now: nothing leaves for one window (``reach``). What a
    fallback starts from when it was never told what the shared window held."""
    return ((0.0, max(1, rule.limit)),)


def shifted(state: WindowState, seconds: float) -> WindowState:
    """``state`` with every bucket moved ``seconds`` later (earlier when negative), by whole buckets and
    never less far forward than asked (nor further back): the wall clock stepped by ``seconds`` since the
    record was written, and the counts must keep their real age, not the clock's."""
    if not state.buckets or not math.isfinite(seconds) or state.width <= 0:
        return state
    k = math.ceil(seconds / state.width - 1e-9)
    if k == 0:
        return state
    return WindowState(state.width, tuple((i + k, c) for i, c in state.buckets), state.checked)
