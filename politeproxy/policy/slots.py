"""Slot arithmetic for the global schedule and per-host readiness (policy core, no I/O).

A grant is a slot: ``slot = max(now, next)``, ``next = slot + gap``, and the request waits until its slot.
The claim is the one decision every store makes under its lock (or inside its Lua script): it reserves the
global slot and the host's next time only if the host is ready by that slot, and otherwise reserves nothing.
All times are wall-clock seconds so they can be shared between processes and survive restarts.
"""

from __future__ import annotations

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

    def ready_at(self) -> float:
        return max(self.next_allowed, self.backoff_until)


class Outcome(StrEnum):
    GRANTED = "granted"
    HOST_NOT_READY = "host_not_ready"
    TOO_LATE = "too_late"


@dataclass(frozen=True)
class Claim:
    outcome: Outcome
    wait: float  # seconds from now until the slot (granted) or until the host/slot would be ready
    at: float  # the slot, or the earliest time the request could go

    @property
    def granted(self) -> bool:
        return self.outcome is Outcome.GRANTED


def claim(
    now: float,
    global_next: float,
    gap: float,
    host: HostState,
    interval: float,
    deadline: float | None = None,
) -> tuple[Claim, float, HostState]:
    """Try to reserve one slot; return the claim, the new global ``next`` and the new host state.

    ``gap`` 0 means the global schedule is off (the host's own interval and backoff still hold).
    ``deadline`` (absolute) makes a claim whose slot would fall after it reserve nothing (``TOO_LATE``).
    """
    slot = max(now, global_next) if gap > 0 else now
    ready = host.ready_at()
    if ready > slot:
        outcome = Outcome.TOO_LATE if deadline is not None and ready > deadline else Outcome.HOST_NOT_READY
        return Claim(outcome, ready - now, ready), global_next, host
    if deadline is not None and slot > deadline:
        return Claim(Outcome.TOO_LATE, slot - now, slot), global_next, host
    new_next = slot + gap if gap > 0 else global_next
    step = max(interval, host.crawl_delay)
    new_host = replace(host, next_allowed=slot + step) if step > 0 else host
    return Claim(Outcome.GRANTED, slot - now, slot), new_next, new_host
