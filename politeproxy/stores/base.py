"""The small interfaces every store implements, and the names of the backends.

``Store`` is the pacer's seam, in four groups: the schedule (``claim``, ``exempt_claim``, ``grants``),
feedback (``throttled``, ``succeeded``, ``set_crawl_delay``, ``mirror_backoff``, ``release``), reads
(``host_view``, ``window_used``) and, kept here for every store alike, the probes this process sent.
``FailoverSide`` adds the four calls a ``FailoverStore`` makes of either of its two stores to copy the
request windows across a switch; the pacer never makes them.

Times cross these interfaces only as relative seconds, so each store may use its own clock (the monotonic
clock for memory, the local wall clock for file, the server's ``TIME`` for Redis) without the callers
caring. ``Claim.at`` is informational only. How a backend is added: docs/architecture.md, "Stores".
"""

from __future__ import annotations

import logging
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

from politeproxy.policy.backoff import BackoffPolicy, Delay, Kind
from politeproxy.policy.fairclaim import FairAsk
from politeproxy.policy.slots import Claim, HostState, Outcome, adaptive_interval
from politeproxy.policy.window import Relative, WindowRule

log = logging.getLogger("politeproxy.store")


class Backend(StrEnum):
    """The values of ``schedule.backend``; each store's ``name`` is one. ``config/storebuild.py`` is the
    one place that builds a store from it."""

    MEMORY = "memory"  # this process alone
    FILE = "file"  # the data dir: every proxy and ccrawl on the machine
    REDIS = "redis"  # a Redis server: proxies on every machine pointed at it

    @property
    def shared(self) -> bool:
        """Do other processes pace on the same schedule (what ``run --workers N`` needs)?"""
        return self is not Backend.MEMORY


BACKENDS = tuple(b.value for b in Backend)


class StoreError(Exception):
    """The store could not answer (lock failed, server unreachable); the caller may fail over."""


class StoreBusy(StoreError):
    """The store works but another process holds it (the data dir's flock) past the wait: the caller waits
    or refuses, never paces on a fresh fallback (a hostile or stuck holder would else reset the window)."""


@dataclass(frozen=True)
class HostView:
    """A host's state as seen now, in relative seconds."""

    ready_in: float = 0.0  # until the host may be sent to (interval or backoff), 0 when ready
    backoff_in: float = 0.0  # until an active Retry-After/backoff ends, 0 when none
    throttles: int = 0
    crawl_delay: float = 0.0
    robots_fresh: bool = False  # the cached crawl-delay is still within its TTL
    blocks: int = 0  # consecutive blocks; > 0 after the hold: the host waits for one probe
    probe_in: float = 0.0  # a probe is out for this much longer (its lease), 0 when none
    adapt_interval: float = 0.0  # the raised interval, stepping down from adapt_from_in to adapt_until_in
    adapt_from_in: float = 0.0
    adapt_until_in: float = 0.0

    def interval(self, base: float) -> float:
        """The host's effective interval now, for a configured interval ``base``."""
        h = HostState(
            adapt_interval=self.adapt_interval, adapt_from=self.adapt_from_in, adapt_until=self.adapt_until_in
        )
        return adaptive_interval(h, 0.0, base)


class WarnOnce:
    """Log a kind of bad record once as a warning, then at debug: a corrupt record is read on every claim,
    and one line says all there is to say."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str, msg: str, *args: object) -> None:
        (log.debug if kind in self.seen else log.warning)(msg, *args)
        self.seen.add(kind)


PROBES_KEPT = 1024  # hosts whose probe this process sent and has not heard back about, at most


class Store(ABC):
    """Where the global schedule and each host's state live: the pacer's one seam to them (the pacer never
    knows which store it has). Every decision is atomic in the store, so processes sharing one agree."""

    _probes: dict[str, None] | None = None  # the hosts whose probe this store object granted
    # Pacing on a fallback because the shared store does not answer (only a FailoverStore ever is).
    degraded: bool = False

    @property
    def name(self) -> str:
        """Read-only here: each store names itself with a class attribute (a ``Backend`` value); the
        failover store answers with the store it paces on now."""
        return "abstract"

    def note_probe(self, host: str, c: Claim) -> None:
        """Remember a probe granted here (bounded, the oldest forgotten) until its answer is recorded."""
        if not c.probe:
            return
        if self._probes is None:
            self._probes = {}
        self._probes[host] = None
        while len(self._probes) > PROBES_KEPT:
            del self._probes[next(iter(self._probes))]

    def probing(self, host: str) -> bool:
        """Did this process send the host's probe, still unanswered? Its success must reach the store at
        once (the pacer otherwise writes a success at most once a second): every proxy waits for it."""
        return self._probes is not None and host in self._probes

    def probe_answered(self, host: str) -> None:
        if self._probes:
            self._probes.pop(host, None)

    @abstractmethod
    async def claim(
        self,
        host: str,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float = 0.0,
        window: WindowRule | None = None,
        fair: FairAsk | None = None,
    ) -> Claim:
        """Atomically reserve the next global slot and the host's next time, or nothing.

        ``gap``: global seconds between grants (0 = off); ``interval``: the host's minimum interval;
        ``max_wait``: reserve nothing if the request would go later than this many seconds from now;
        ``not_before``: the slot is at least this many seconds from now (the failover store's grace);
        ``window``: the host's service's request window, checked and counted in the same step
        (``policy.window``): a slot it has no room for reserves nothing (``Claim.window``);
        ``fair``: the asking pipeline and this proxy's backlog (``policy.fairclaim``), for a store shared by
        several proxies: a claim out of the pipeline's fair turn reserves nothing (``NOT_YOUR_TURN``, with
        whose turn it is). Only with a gap: without a global schedule there is no slot to share.
        """

    async def exempt_claim(
        self,
        host: str,
        rate: float,
        burst: int,
        max_wait: float | None,
        hold: bool = True,
        ceiling: str | None = None,
        window: WindowRule | None = None,
    ) -> Claim:
        """Atomically take a GCRA slot for an exempt read (``rate`` seconds apart after a ``burst``; 0 = no
        ceiling), or nothing. A backoff, a block or a probe out holds it (HOST_NOT_READY).
        ``ceiling``: the record the GCRA state is kept in (the host's service, ``policy.services``), when
        it is not ``host``'s own; the hold is always read from ``host``'s. ``window``: as in ``claim``.

        The stores override this; this fallback (for a store that keeps no ceiling and no window) only
        honours the host's backoff."""
        view = await self.host_view(host)
        wait = max(view.backoff_in, view.probe_in if view.blocks else 0.0)
        if hold and wait > 0:
            return Claim(Outcome.HOST_NOT_READY, wait, time.time() + wait)
        return Claim(Outcome.GRANTED, 0.0, time.time())

    @abstractmethod
    async def throttled(
        self,
        host: str,
        retry_after: float | None,
        policy: BackoffPolicy,
        kind: Kind = Kind.THROTTLE,
        base: float = 0.0,
    ) -> Delay:
        """Record a throttle, block or failure and push the host's next allowed time out; return the delay
        applied. ``base``: the host's configured interval, from which the adaptive interval is raised."""

    @abstractmethod
    async def succeeded(self, host: str) -> None:
        """Record a non-throttle answer: the consecutive counts reset, and a block whose hold is over ends."""

    @abstractmethod
    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        """Remember a (capped) robots.txt Crawl-delay for ``ttl`` seconds."""

    @abstractmethod
    async def host_view(self, host: str) -> HostView:
        """The host's state now, in relative seconds (status, the gauges, the dispatcher's wake-ups)."""

    async def window_used(self, rule: WindowRule) -> int:
        """Requests the service's window holds now (slots reserved for later included), for status."""
        return 0

    @abstractmethod
    async def grants(self) -> int:
        """Grants counted by the global record (all processes sharing this store)."""

    async def release(self, host: str) -> None:
        """Lift the host's backoff, block and probe, and reset its counts and raised interval (``politeproxy
        release``): every proxy sharing the store sends to it again at its configured pace."""
        raise NotImplementedError(f"{self.name} cannot release a host")

    async def mirror_backoff(self, host: str, seconds: float) -> None:
        """Push the host's backoff out to at least ``seconds`` from now, leaving its throttle count alone:
        the failover store copies every backoff the shared store records here, so the fallback knows it."""
        raise NotImplementedError(f"{self.name} cannot be a fallback store")

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class FailoverSide(Store):
    """A store that can be either side of a ``FailoverStore``: it copies request windows in and out, so a
    switch from the shared store to the fallback (and back) never starts from an empty window. Memory,
    file and Redis stores all are; the defaults here keep nothing."""

    async def window_counts(self, rule: WindowRule) -> Relative:
        """The service's window as ``policy.window.relative`` counts (bucket ends in seconds from now):
        read by the failover store while this store answers, to seed its fallback with. () keeps none."""
        return ()

    async def mirror_window(self, rule: WindowRule, counts: Relative) -> None:
        """Count at least ``counts`` in the service's window (``policy.window.merged``): the failover store
        seeds its fallback with the shared window before pacing on it, so a switch never starts empty."""
        raise NotImplementedError(f"{self.name} cannot be a fallback store")

    async def window_known(self, rule: WindowRule) -> bool:
        """Does this store hold a copy of the service's window written within the window's reach (mirrored
        while the shared store answered, or its own counting)? A fallback that does not starts full."""
        return False

    async def add_window(self, rule: WindowRule, counts: Relative) -> None:
        """Count ``counts`` in the service's window on top of what it holds: the grants the failover
        store's fallback made while this store was down, added when it answers again (they are in no
        other proxy's copy, so each proxy adds its own and the sum is exact)."""
        raise NotImplementedError(f"{self.name} cannot take a fallback's grants")


def other_ceiling(host: str, ceiling: str | None) -> str | None:
    """The record an exempt claim keeps its ceiling in when it is not ``host``'s own, else None."""
    return None if ceiling is None or ceiling == host else ceiling


def jitter_source() -> float:
    return random.random()
