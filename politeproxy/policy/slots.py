"""Slot arithmetic for the global schedule and per-host readiness (policy core, no I/O).

A grant is a slot: ``slot = max(now, next)``, ``next = slot + gap``, and the request waits until its slot.
The claim is the one decision every store makes under its lock (or inside its Lua script): it reserves the
global slot and the host's next time only if the host is ready by that slot, and otherwise reserves nothing.
All times are wall-clock seconds so they can be shared between processes and survive restarts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum


@dataclass(frozen=True)
class HostState:
    """What the store remembers about one paced host."""

    next_allowed: float = 0.0  # earliest next grant by the host's own interval
    backoff_until: float = 0.0  # earliest next request after a throttle (Retry-After or backoff)
    throttles: int = 0  # consecutive throttles since the last success
    crawl_delay: float = 0.0  # robots.txt Crawl-delay, already capped
    robots_expires: float = 0.0  # when the cached crawl-delay goes stale
    blocks: int = 0  # consecutive blocks (403) since the last success: the hold doubles with each
    fails: int = 0  # consecutive connection failures: FAIL_BLOCK of them count as a block
    probe_until: float = 0.0  # a probe is out until then (its lease); 0 = none
    adapt_interval: float = 0.0  # the adaptive interval raised by the last throttle (0 = none)
    adapt_from: float = 0.0  # when it starts stepping back down (the end of that backoff)
    adapt_until: float = 0.0  # when it is back at the configured interval
    tat: float = 0.0  # GCRA theoretical arrival time of the host's exempt reads

    def ready_at(self) -> float:
        return max(self.next_allowed, self.backoff_until)


EMPTY_HOST = HostState()  # a host with nothing recorded: the usual record, shared (frozen)


class Outcome(StrEnum):
    GRANTED = "granted"
    HOST_NOT_READY = "host_not_ready"
    TOO_LATE = "too_late"
    NOT_YOUR_TURN = "not_your_turn"  # another pipeline's fair turn (policy.fairclaim): ask again after wait


@dataclass(frozen=True)
class Claim:
    outcome: Outcome
    wait: float  # seconds from now until the slot (granted) or until the host/slot would be ready
    at: float  # the slot, or the earliest time the request could go
    probe: bool = False  # granted as the probe after a block: its answer must reach the store at once
    window: bool = False  # not granted because the service's request window is full (policy.window)
    turn: str = ""  # NOT_YOUR_TURN: the pipeline whose turn it is

    @property
    def granted(self) -> bool:
        return self.outcome is Outcome.GRANTED


PROBE_LEASE = 30.0  # a probe whose answer never comes (its proxy died) frees the host after this
PROBE_POLL = 0.25  # how often the others look whether the probe has answered
ADAPT_STEPS = 4  # the adaptive interval steps back to the configured one in this many equal steps


def adaptive_interval(h: HostState, t: float, base: float) -> float:
    """The host's effective interval at ``t``: the raised one until its recovery starts, then down to
    ``base`` (the configured interval) in ADAPT_STEPS equal steps, and ``base`` once the recovery is over."""
    e = h.adapt_interval
    if e <= base or t >= h.adapt_until:
        return base
    if t < h.adapt_from:
        return e
    span = h.adapt_until - h.adapt_from
    if span <= 0:
        return base
    k = min(ADAPT_STEPS, math.floor((t - h.adapt_from) / (span / ADAPT_STEPS)))
    return e - (e - base) * k / ADAPT_STEPS


def _raised(h: HostState, t: float, base: float) -> float:
    """The adaptive interval while it is raised, else 0 (no constraint beyond the configured ones)."""
    return adaptive_interval(h, t, base) if h.adapt_interval > base and t < h.adapt_until else 0.0


def _probe_wait(host: HostState, now: float) -> float | None:
    """None when the host may go (no block, or a probe may be sent now); else how long to look again."""
    if host.blocks > 0 and host.probe_until > now:
        return min(host.probe_until - now, PROBE_POLL)
    return None


def claim(
    now: float,
    global_next: float,
    gap: float,
    host: HostState,
    interval: float,
    deadline: float | None = None,
    earliest: float = 0.0,
) -> tuple[Claim, float, HostState]:
    """Try to reserve one slot; return the claim, the new global ``next`` and the new host state.

    ``gap`` 0 means the global schedule is off (the host's own interval and backoff still hold).
    ``deadline`` (absolute) makes a claim whose slot would fall after it reserve nothing (``TOO_LATE``).
    ``earliest`` (absolute): the slot is no earlier than this (the failover store's local slot in its grace).
    """
    slot = max(now, global_next, earliest) if gap > 0 else max(now, earliest)
    ready = host.ready_at()
    if ready > slot:
        outcome = Outcome.TOO_LATE if deadline is not None and ready > deadline else Outcome.HOST_NOT_READY
        return Claim(outcome, ready - now, ready), global_next, host
    if (poll := _probe_wait(host, now)) is not None:  # blocked, and the probe is out: wait for its answer
        return Claim(Outcome.HOST_NOT_READY, poll, now + poll), global_next, host
    if deadline is not None and slot > deadline:
        return Claim(Outcome.TOO_LATE, slot - now, slot), global_next, host
    new_next = slot + gap if gap > 0 else global_next
    step = max(interval, host.crawl_delay, _raised(host, slot, max(interval, gap)))
    new_host = replace(host, next_allowed=slot + step) if step > 0 else host
    if host.blocks > 0:  # the hold is over: this grant is the probe, and goes alone
        new_host = replace(new_host, probe_until=slot + PROBE_LEASE)
    return Claim(Outcome.GRANTED, slot - now, slot, host.blocks > 0), new_next, new_host


def exempt_claim(
    now: float, host: HostState, rate: float, burst: int, deadline: float | None = None, hold: bool = True
) -> tuple[Claim, HostState]:
    """A GCRA slot for an exempt read (as redis-cell): ``burst`` reads at once, then one per ``rate``
    seconds (0 = no ceiling). The host's backoff, block and probe hold exempt reads as they hold paced ones
    (``hold`` false: exempt.respect_backoff = false, the ceiling only). The slot is reserved (the
    theoretical arrival time moves) only when it is granted."""
    if hold and host.backoff_until > now:
        ready = host.backoff_until
        outcome = Outcome.TOO_LATE if deadline is not None and ready > deadline else Outcome.HOST_NOT_READY
        return Claim(outcome, ready - now, ready), host
    if hold and (poll := _probe_wait(host, now)) is not None:
        return Claim(Outcome.HOST_NOT_READY, poll, now + poll), host
    slot, new = now, host
    if rate > 0:
        tat = max(host.tat, now)
        slot = max(now, tat + rate - max(1, burst) * rate)
        new = replace(host, tat=tat + rate)
    if deadline is not None and slot > deadline:
        return Claim(Outcome.TOO_LATE, slot - now, slot), host
    probe = hold and host.blocks > 0
    if probe:
        new = replace(new, probe_until=slot + PROBE_LEASE)
    return Claim(Outcome.GRANTED, slot - now, slot, probe), new


def exempt_claim_split(
    now: float,
    host: HostState,
    ceiling: HostState,
    rate: float,
    burst: int,
    deadline: float | None = None,
    hold: bool = True,
) -> tuple[Claim, HostState, HostState]:
    """``exempt_claim`` with the ceiling's arrival time kept in another record (the service's: issue 24,
    one ceiling for every name of the bucket) and the hold read from the host's own. Returns the claim, the
    new host record and the new ceiling record."""
    c, new = exempt_claim(now, replace(host, tat=ceiling.tat), rate, burst, deadline, hold)
    return c, replace(new, tat=host.tat), replace(ceiling, tat=new.tat)


# -- sanity bounds for records read back from a store ------------------------------------------------------
#
# A record is a file or a Redis hash that anything may have written: a corrupt file, a clock that stepped
# back, a stray HSET. A time further ahead than the longest wait that could be legitimate is treated as now
# (and the store logs it once); a value that is not a finite number is treated as absent. The Lua scripts in
# stores/redis_lua.py apply the same bounds; tests/unit/stores/test_claim_cases.py keeps the two in step.

SCHEDULE_SLACK = 60.0  # the global next: a minute ...
SCHEDULE_GAPS = 4.0  # ... plus a few gaps (each proxy reserves at most about one slot ahead)
MAX_CRAWL_DELAY = 3600.0  # the ceiling of robots.max_crawl_delay
MAX_ROBOTS_TTL = 30 * 86400.0  # the ceiling of robots.ttl
MAX_BACKOFF = 86400.0  # the ceiling of pacing.backoff_cap: the bound when a store is not told the cap
MAX_DURATION = 86400.0  # any gap, interval or wait a store is handed is clamped to this
MAX_THROTTLES = 1000  # beyond 64 the exponential backoff is at its cap anyway
MAX_RECOVERY = 86400.0  # the ceiling of pacing.adaptive_recovery
MAX_TAT = 86400.0  # a GCRA arrival time further ahead than burst x rate can be: the ceilings' product


def duration(x: float, hi: float = MAX_DURATION) -> float:
    """A duration clamped to [0, hi]. NaN and +inf become ``hi`` (the polite end), so an odd number handed
    to a store never raises (OverflowError) and never switches pacing off (NaN fails every ``> 0``)."""
    if x != x:
        return hi
    return min(hi, max(0.0, x))


@dataclass(frozen=True)
class Bounds:
    """How far ahead of now each recorded time may legitimately be (seconds)."""

    gap: float = 0.0  # the global gap of the claim at hand
    step: float = 0.0  # the host's own interval
    backoff: float = MAX_BACKOFF  # the backoff cap (a Retry-After is capped to it too)

    def schedule(self) -> float:
        return SCHEDULE_SLACK + SCHEDULE_GAPS * self.gap

    def host_next(self, crawl_delay: float, adapt: float = 0.0) -> float:
        return self.schedule() + max(self.step, crawl_delay, adapt)


def sane_time(t: float, now: float, ahead: float) -> tuple[float, bool]:
    """``t`` when it is a finite time at most ``ahead`` past ``now``, else ``now``; and whether it was sane.
    Times before the epoch become 0 (the past: no constraint)."""
    if t != t or t > now + ahead:  # NaN or too far ahead (+inf included)
        return now, False
    return max(0.0, t), True


def sane_global(global_next: float, now: float, b: Bounds, last: float = 0.0) -> tuple[float, bool]:
    """The global next slot within its bound. An insane one becomes now + one gap, or the next slot this
    store itself wrote last when that is later and sane: a record corrupted under a running proxy must not
    make the next grant land on the one it made a moment ago."""
    t, ok = sane_time(global_next, now, b.schedule())
    if ok:
        return t, True
    if now < last <= now + b.schedule():
        return max(now + b.gap, last), False
    return now + b.gap, False


def _count(n: int) -> int:
    return min(max(0, n), MAX_THROTTLES)


def _within(h: HostState, now: float, b: Bounds) -> bool:
    """Every field of the record within the bound ``bounded_host`` gives it (same sums, same order, so the
    same floats): then ``sane_host`` answers without building a new record. NaN fails every comparison."""
    cd, ai = h.crawl_delay, h.adapt_interval
    if not (
        0.0 <= cd <= MAX_CRAWL_DELAY
        and 0.0 <= ai <= MAX_DURATION
        and 0 <= h.throttles <= MAX_THROTTLES
        and 0 <= h.blocks <= MAX_THROTTLES
        and 0 <= h.fails <= MAX_THROTTLES
    ):
        return False
    sched = SCHEDULE_SLACK + SCHEDULE_GAPS * b.gap
    hold = (max(b.backoff, MAX_BACKOFF) if h.blocks else b.backoff) + 1.0
    return (
        0.0 <= h.next_allowed <= now + (sched + max(b.step, cd, ai))
        and 0.0 <= h.backoff_until <= now + hold
        and 0.0 <= h.robots_expires <= now + MAX_ROBOTS_TTL
        and 0.0 <= h.probe_until <= now + (sched + PROBE_LEASE)
        and 0.0 <= h.adapt_from <= now + hold
        and 0.0 <= h.adapt_until <= now + (hold + MAX_RECOVERY)
        and 0.0 <= h.tat <= now + MAX_TAT
    )


def sane_host(h: HostState, now: float, b: Bounds) -> tuple[HostState, bool]:
    """The host record with every field within its bound; and whether it already was."""
    if b.gap >= 0.0 and b.backoff >= 0.0 and ((h is EMPTY_HOST and now >= 0.0) or _within(h, now, b)):
        return h, True  # the usual record, past or a legitimate wait ahead: nothing to bound (hot path)
    return bounded_host(h, now, b)


def bounded_host(h: HostState, now: float, b: Bounds) -> tuple[HostState, bool]:
    """``sane_host`` without its shortcut: every field checked against its bound."""
    cd = h.crawl_delay
    cd_ok = cd == cd and 0.0 <= cd <= MAX_CRAWL_DELAY
    cd = cd if cd_ok else 0.0
    ai = h.adapt_interval
    ai_ok = ai == ai and 0.0 <= ai <= MAX_DURATION
    ai = ai if ai_ok else 0.0
    counts = (_count(h.throttles), _count(h.blocks), _count(h.fails))
    # a block holds for block_hold_cap, which may exceed the backoff cap: bounded by the ceiling then
    hold = max(b.backoff, MAX_BACKOFF) if counts[1] else b.backoff
    nxt, ok1 = sane_time(h.next_allowed, now, b.host_next(cd, ai))
    until, ok2 = sane_time(h.backoff_until, now, hold + 1.0)  # 1 s: rounding and a slow write
    robots, ok3 = sane_time(h.robots_expires, now, MAX_ROBOTS_TTL)
    probe, ok4 = sane_time(h.probe_until, now, b.schedule() + PROBE_LEASE)
    afrom, ok5 = sane_time(h.adapt_from, now, hold + 1.0)
    auntil, ok6 = sane_time(h.adapt_until, now, hold + 1.0 + MAX_RECOVERY)
    tat, ok7 = sane_time(h.tat, now, MAX_TAT)
    ok = cd_ok and ai_ok and ok1 and ok2 and ok3 and ok4 and ok5 and ok6 and ok7
    ok = ok and counts == (h.throttles, h.blocks, h.fails)
    sane = HostState(nxt, until, counts[0], cd, robots, counts[1], counts[2], probe, ai, afrom, auntil, tat)
    return (h if sane == h else sane), ok  # times before the epoch are no constraint: sane, as 0
