"""Per-host FIFO queues and one dispatcher over a store.

The dispatcher holds at most one reserved slot at a time: it claims, sleeps until the slot, hands it to the
request, and claims again. Several proxies sharing a store therefore interleave on one schedule, and a
request that leaves before its claim spends no slot. The longest-waiting request of a ready host goes next;
a host in backoff is skipped until it is ready, so it never delays another host.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from politeproxy.policy.backoff import DEFAULT_THROTTLE_CODES, BackoffPolicy, Delay, parse_retry_after
from politeproxy.policy.classify import Klass
from politeproxy.policy.hosts import host_matches
from politeproxy.policy.slots import Outcome
from politeproxy.stores.base import HostView, Store, StoreError

log = logging.getLogger("politeproxy.pacing.pacer")

INDEX_HOST_INTERVAL = 1.0
SUCCESS_RECHECK = 1.0  # seconds between store resets of a host's throttle count on success


@dataclass(frozen=True)
class PacingSettings:
    gap: float = 0.2  # global seconds between grants; 0 = off
    max_wait: float = 25.0
    retries: int = 2
    throttle_codes: frozenset[int] = DEFAULT_THROTTLE_CODES
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    # host pattern -> minimum interval; index.commoncrawl.org is one fragile server
    host_intervals: tuple[tuple[str, float], ...] = (("index.commoncrawl.org", INDEX_HOST_INTERVAL),)
    exempt_max_in_flight: int = 16
    exempt_respect_backoff: bool = True

    def interval_for(self, host: str) -> float:
        for pattern, interval in self.host_intervals:
            if host_matches(host, pattern):
                return interval
        return 0.0


class WaitTooLong(Exception):
    """The request would be held past ``max_wait``; ``wait`` is how long until it could go."""

    def __init__(self, wait: float, why: str) -> None:
        super().__init__(why)
        self.wait = wait
        self.why = why


class PacerEvents:
    """Hooks for metrics; the pacer calls these and knows nothing of Prometheus."""

    def granted(self, host: str, lateness: float) -> None: ...
    def waited(self, host: str, klass: Klass, seconds: float) -> None: ...
    def throttled(self, host: str, code: int, delay: float) -> None: ...
    def rejected(self, host: str, reason: str) -> None: ...
    def queue_changed(self, host: str, depth: int) -> None: ...
    def exempt_changed(self, host: str, in_flight: int) -> None: ...


@dataclass(eq=False)
class _Waiter:
    host: str
    arrived: float
    deadline: float
    future: asyncio.Future[float]


class Permit:
    """One request's turn, from ``Pacer.permit``: how long it was held, and where its answer goes."""

    __slots__ = ("_pacer", "host", "klass", "waited")

    def __init__(self, pacer: Pacer, host: str, klass: Klass, waited: float) -> None:
        self._pacer = pacer
        self.host = host
        self.klass = klass
        self.waited = waited

    async def answered(self, status: int | None, retry_after: str | None) -> Delay | None:
        """Feed the upstream's answer back (``status`` None: the connection failed or timed out).

        The store write runs in a task the pacer owns and is awaited through ``asyncio.shield``: a caller
        cancelled here (its client left) never loses a throttle the upstream already sent.
        """
        return await self._pacer.feedback(self.host, status, retry_after)


class Pacer:
    """One request budget for every paced host. Use it as aiolimiter's limiters are used::

        async with pacer.permit(host, Klass.PACED) as p:      # waits for a slot, or raises WaitTooLong
            resp = await send(...)
            delay = await p.answered(resp.status, resp.headers.get("Retry-After"))

    ``Klass.EXEMPT`` holds one of the host's exempt places for the block instead of a slot.
    """

    def __init__(
        self,
        store: Store,
        settings: PacingSettings | None = None,
        events: PacerEvents | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings or PacingSettings()
        self.events = events or PacerEvents()
        self.monotonic = monotonic
        self.queues: dict[str, deque[_Waiter]] = {}
        self.host_ready: dict[str, float] = {}  # local monotonic hint of when a host may be claimed
        self.maybe_throttled: set[str] = set()
        # When each host's throttle count in the store was last reset (or found clean) by a success here.
        self._success_checked: dict[str, float] = {}
        self.in_flight: dict[str, int] = {}
        self._exempt_cond: dict[str, asyncio.Condition] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._feedback_tasks: set[asyncio.Task[Delay | None]] = set()
        self.grants = 0

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch_forever())

    async def close(self) -> None:
        if self._feedback_tasks:
            await asyncio.wait(set(self._feedback_tasks), timeout=5.0)
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for q in self.queues.values():
            for w in q:
                if not w.future.done():
                    w.future.set_exception(WaitTooLong(1.0, "proxy shutting down"))
            q.clear()

    def update(self, settings: PacingSettings) -> None:
        self.settings = settings
        self._wake.set()
        for cond in self._exempt_cond.values():
            asyncio.get_running_loop().create_task(self._notify(cond))

    @staticmethod
    async def _notify(cond: asyncio.Condition) -> None:
        async with cond:
            cond.notify_all()

    def depth(self, host: str | None = None) -> int:
        if host is not None:
            return len(self.queues.get(host, ()))
        return sum(len(q) for q in self.queues.values())

    # -- paced --------------------------------------------------------------------------------------

    def _estimate(self, host: str, now: float) -> float:
        """A lower bound on the wait of a request queued now, from what this process can see.

        Only hosts that could go now count as ahead on the global schedule: a line of requests behind a
        host's backoff must not get another, ready host refused for max_wait.
        """
        s = self.settings
        own = self.depth(host)
        ready_ahead = sum(
            len(q) for h, q in self.queues.items() if h != host and self.host_ready.get(h, 0.0) <= now
        )
        host_wait = max(0.0, self.host_ready.get(host, 0.0) - now)
        return max((ready_ahead + own) * s.gap, host_wait + own * max(s.gap, s.interval_for(host)))

    async def wait_paced(self, host: str, arrived: float | None = None) -> float:
        """Wait for a slot for ``host``; return seconds waited. Raises WaitTooLong."""
        self.start()
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + self.settings.max_wait
        est = self._estimate(host, now)
        if now + est > deadline:
            self.events.rejected(host, "max_wait")
            raise WaitTooLong(est, f"{host} is paced and this request would wait {est:.1f}s")
        if self.settings.gap <= 0 and not self.queues.get(host) and self.host_ready.get(host, 0.0) <= now:
            # Global pacing off and nobody ahead for this host: claim in this task, skipping the hand-off
            # to the dispatcher. The store still answers, so a host's interval and backoff still hold.
            try:
                c = await self.store.claim(host, 0.0, self.settings.interval_for(host), deadline - now)
            except StoreError:
                c = None
            if c is not None and c.granted and c.wait <= 0:
                self.grants += 1
                self.events.granted(host, 0.0)
                waited = self.monotonic() - arrived
                self.events.waited(host, Klass.PACED, waited)
                return waited
            if c is not None and c.outcome is Outcome.HOST_NOT_READY:
                self.host_ready[host] = now + c.wait
        w = _Waiter(host, arrived, deadline, asyncio.get_running_loop().create_future())
        q = self.queues.setdefault(host, deque())
        q.append(w)
        self.events.queue_changed(host, len(q))
        self._wake.set()
        try:
            async with asyncio.timeout(max(0.0, deadline - now) + 0.05):
                await w.future
        except TimeoutError:
            wait = self._estimate(host, self.monotonic())
            self.events.rejected(host, "max_wait")
            raise WaitTooLong(max(wait, 1.0), f"{host} is paced and the wait exceeded max_wait") from None
        finally:
            self._drop(w)
        waited = self.monotonic() - arrived
        self.events.waited(host, Klass.PACED, waited)
        return waited

    def _drop(self, w: _Waiter) -> None:
        q = self.queues.get(w.host)
        if q is not None:
            try:
                q.remove(w)
            except ValueError:
                return
            self.events.queue_changed(w.host, len(q))

    def _next_ready_host(self, now: float) -> tuple[str | None, float | None]:
        best: _Waiter | None = None
        soonest: float | None = None
        for host, q in self.queues.items():
            while q and q[0].future.done():  # left already (client gone, timed out)
                q.popleft()
                self.events.queue_changed(host, len(q))
            if not q:
                continue
            ready = self.host_ready.get(host, 0.0)
            if ready > now:
                soonest = ready if soonest is None else min(soonest, ready)
                continue
            if best is None or q[0].arrived < best.arrived:
                best = q[0]
        return (best.host if best else None), soonest

    async def _dispatch_forever(self) -> None:
        while True:
            try:
                await self._dispatch_once()
            except asyncio.CancelledError:
                raise
            except StoreError as e:
                log.error("schedule store error: %s", e)
                await asyncio.sleep(0.1)
            except Exception:
                log.exception("pacer dispatcher error")
                await asyncio.sleep(0.1)

    async def _dispatch_once(self) -> None:
        now = self.monotonic()
        host, soonest = self._next_ready_host(now)
        if host is None:
            self._wake.clear()
            timeout = None if soonest is None else max(0.0, soonest - now)
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
            return
        q = self.queues[host]
        head = q[0]
        s = self.settings
        c = await self.store.claim(host, s.gap, s.interval_for(host), max(0.0, head.deadline - now))
        now = self.monotonic()
        if c.outcome is Outcome.GRANTED:
            if q and q[0] is head:
                q.popleft()
                self.events.queue_changed(host, len(q))
            slot = now + c.wait
            if c.wait > 0:
                await asyncio.sleep(c.wait)
                # Event-loop timers may fire up to a millisecond early (uvloop rounds to whole ms against a
                # cached loop time); a grant must never precede its slot.
                while (rest := slot - self.monotonic()) > 0:
                    await asyncio.sleep(max(rest, 0.001))
            if head.future.done():
                # The client left while its slot came up: give the slot to the next in this host's line.
                while q and q[0].future.done():
                    q.popleft()
                if q:
                    head = q.popleft()
                self.events.queue_changed(host, len(q))
            self.grants += 1
            self.events.granted(host, max(0.0, self.monotonic() - slot))
            if not head.future.done():
                head.future.set_result(slot)
        elif c.outcome is Outcome.HOST_NOT_READY:
            self.host_ready[host] = now + c.wait
        else:  # TOO_LATE: the head cannot go before its deadline
            if q and q[0] is head:
                q.popleft()
                self.events.queue_changed(host, len(q))
            if not head.future.done():
                self.events.rejected(host, "max_wait")
                head.future.set_exception(
                    WaitTooLong(c.wait, f"{host} is paced and this request would wait {c.wait:.1f}s")
                )
            if c.wait > 0:
                self.host_ready[host] = max(self.host_ready.get(host, 0.0), now + min(c.wait, 0.05))

    # -- exempt -------------------------------------------------------------------------------------

    @asynccontextmanager
    async def exempt(self, host: str, arrived: float | None = None) -> AsyncIterator[float]:
        """Hold one of the host's exempt places for the whole exchange; yields seconds waited."""
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + self.settings.max_wait
        if self.settings.exempt_respect_backoff:
            view = await self.store.host_view(host)
            if view.backoff_in > 0:
                if now + view.backoff_in > deadline:
                    self.events.rejected(host, "max_wait")
                    raise WaitTooLong(view.backoff_in, f"{host} is backing off for {view.backoff_in:.1f}s")
                await asyncio.sleep(view.backoff_in)
        cond = self._exempt_cond.setdefault(host, asyncio.Condition())
        try:
            async with asyncio.timeout(max(0.0, deadline - self.monotonic())):
                async with cond:
                    await cond.wait_for(
                        lambda: self.in_flight.get(host, 0) < self.settings.exempt_max_in_flight
                    )
                    self.in_flight[host] = self.in_flight.get(host, 0) + 1
        except TimeoutError:
            self.events.rejected(host, "max_wait")
            n = self.in_flight.get(host, 0)
            raise WaitTooLong(1.0, f"{host} has {n} exempt reads in flight") from None
        self.events.exempt_changed(host, self.in_flight[host])
        waited = self.monotonic() - arrived
        self.events.waited(host, Klass.EXEMPT, waited)
        try:
            yield waited
        finally:
            self.in_flight[host] -= 1
            self.events.exempt_changed(host, self.in_flight[host])
            async with cond:
                cond.notify(1)

    # -- the facade ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def permit(self, host: str, klass: Klass, arrived: float | None = None) -> AsyncIterator[Permit]:
        """Hold the request until it may go (a slot, or an exempt place); raises WaitTooLong."""
        if klass is Klass.EXEMPT:
            async with self.exempt(host, arrived) as waited:
                yield Permit(self, host, klass, waited)
        else:
            waited = await self.wait_paced(host, arrived)
            yield Permit(self, host, klass, waited)

    async def feedback(self, host: str, status: int | None, retry_after: str | None) -> Delay | None:
        """Record an answer in a task of our own, shielded from the caller's cancellation."""
        ra = parse_retry_after(retry_after, time.time())
        task = asyncio.get_running_loop().create_task(self.record(host, status, ra))
        self._feedback_tasks.add(task)
        task.add_done_callback(self._feedback_tasks.discard)
        return await asyncio.shield(task)

    # -- answers ------------------------------------------------------------------------------------

    def is_throttle(self, status: int | None) -> bool:
        return status is None or status in self.settings.throttle_codes

    async def record(self, host: str, status: int | None, retry_after: float | None) -> Delay | None:
        """Feed an upstream answer back; ``status`` None means the connection failed or timed out."""
        if self.is_throttle(status):
            delay = await self.store.throttled(host, retry_after, self.settings.backoff)
            self.host_ready[host] = max(self.host_ready.get(host, 0.0), self.monotonic() + delay.seconds)
            self.maybe_throttled.add(host)
            self.events.throttled(host, status or 0, delay.seconds)
            if delay.capped_from is not None:
                log.warning(
                    "%s: Retry-After %.0fs cut to the %.0fs cap", host, delay.capped_from, delay.seconds
                )
            self._wake.set()
            return delay
        # A success resets the count even when the throttles were recorded by another proxy sharing the
        # store, or by this one before a restart; checking at most once a second keeps the store quiet.
        now = self.monotonic()
        last = self._success_checked.get(host)
        if host in self.maybe_throttled or last is None or now - last >= SUCCESS_RECHECK:
            self.maybe_throttled.discard(host)
            self._success_checked[host] = now
            await self.store.succeeded(host)
        return None

    async def host_view(self, host: str) -> HostView:
        return await self.store.host_view(host)
