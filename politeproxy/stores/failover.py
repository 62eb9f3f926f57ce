"""Never fail open: when the primary store fails, pace on a local fallback with a wider gap.

N proxies that lose their shared store together each pace alone, so each multiplies the gap by
``gap_multiplier`` to keep the sum within the budget: the live count of proxies last seen while the
primary answered (their heartbeats, ``note_live``), never below ``schedule.expected_proxies``. The primary is
probed in the background and used again as soon as it answers.

Both switches are guarded, because the proxies do not switch at the same instant, and because a slot is
reserved before its wait, so the last grant of one schedule may still lie ahead when the switch happens:

- to the fallback: the first local grant waits one widened gap after the last shared one (or after the
  switch, when that is later);
- back to the primary: the first shared grant waits one widened gap after the last local one, and for a
  grace period each grant must also fit the local widened schedule, since other proxies may still be
  pacing locally; the first grant after the grace waits one gap after the last grace grant.

Both are one ``_floor`` (monotonic): no paced grant before it. Every backoff and crawl-delay the primary
records is mirrored into the fallback, so a proxy that loses (or starts without) the shared store still
knows which hosts are resting; and so is each service's request window (``stores/window_mirror.py``), so
the fallback never starts from an empty one.

A primary that works but is held by another process past its wait (``StoreBusy``: the data dir's flock)
is no outage: a claim then waits (or is refused at its deadline), never paces on the fallback, and the log
names the holder; feedback that cannot wait is recorded in the fallback meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from politeproxy.policy.backoff import BackoffPolicy, Delay, Kind
from politeproxy.policy.fairclaim import FairAsk
from politeproxy.policy.heartbeat import MAX_PROXIES, multiplier
from politeproxy.policy.slots import Claim, Outcome, duration
from politeproxy.policy.window import WindowRule, divided
from politeproxy.stores.base import FailoverSide, HostView, Store, StoreBusy, StoreError, WarnOnce
from politeproxy.stores.window_mirror import WindowMirror

log = logging.getLogger("politeproxy.store")
T = TypeVar("T")
FAILS = (StoreError, OSError, ConnectionError)
BUSY_WAIT = 1.0  # a claim refused because another process holds the store asks again after this


class FailoverStore(Store):
    """A shared ``primary`` and a local ``fallback`` paced on (gap widened) while the primary is down.
    Callers read ``name`` and ``degraded``; the heartbeats get ``note_live`` (config/storebuild.py)."""

    def __init__(
        self,
        primary: FailoverSide,
        fallback: FailoverSide,
        gap_multiplier: float = 1.0,
        probe_interval: float = 1.0,
        on_change: Callable[[Store, bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.floor_multiplier = max(1.0, duration(gap_multiplier, 1000.0))  # schedule.expected_proxies
        self.live_seen = 0  # proxies live on the primary when last counted (heartbeats)
        self.probe_interval = probe_interval
        self.on_change = on_change
        self.monotonic = monotonic
        self.degraded = False
        self._warned = False
        self._warn = WarnOnce()
        self._probe: asyncio.Task[None] | None = None
        self._floor = 0.0  # no paced grant before this (monotonic): the switch-over guards
        self._grace_until = 0.0  # after returning, grants also fit the local widened schedule
        self._gap = 0.0  # the gap of the last paced claim
        self._last_shared = 0.0  # slot of the last paced grant from the primary alone (monotonic)
        self._last_local = 0.0  # slot of the last paced grant that went by the local schedule
        self.mirror = WindowMirror(monotonic)  # the shared windows, to seed the fallback with
        self._busy_since: float | None = None  # the primary held by another process since (monotonic)

    @property
    def active(self) -> FailoverSide:
        return self.fallback if self.degraded else self.primary

    @property
    def name(self) -> str:
        return self.active.name

    @property
    def gap_multiplier(self) -> float:
        return multiplier(self.floor_multiplier, self.live_seen)

    def note_live(self, count: int) -> float:
        """The live proxies counted on the primary; ignored while degraded (the count seen last, when the
        primary answered, is the one that says how many proxies now pace alone). Returns the gap
        multiplier the fallback paces with."""
        if not self.degraded:
            self.live_seen = max(0, min(int(count), MAX_PROXIES))
            self._read_when_due()
        return self.gap_multiplier

    @property
    def _wide(self) -> float:
        return self._gap * self.gap_multiplier

    def _degrade(self, err: BaseException) -> None:
        if self.degraded:
            return
        self.degraded = True
        self.mirror.seeded.clear()  # each service's window is seeded anew on its first local claim
        self._floor = max(self._floor, max(self.monotonic(), self._last_shared) + self._wide)
        msg = "schedule store %s failed (%s); pacing on %s with the gap x%g until it answers again"
        args = (self.primary.name, err, self.fallback.name, self.gap_multiplier)
        # Warn once whatever the verbosity; later flaps go to info.
        (log.info if self._warned else log.warning)(msg, *args)
        self._warned = True
        if self.on_change:
            self.on_change(self.fallback, True)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    def _returned(self) -> None:
        self.degraded = False
        self._floor = max(self._floor, self._last_local + self._wide)
        self._grace_until = max(self.monotonic(), self._floor) + 2 * self.probe_interval + 0.5
        log.warning("schedule store %s answers again; back on it", self.primary.name)
        if self.on_change:
            self.on_change(self.primary, False)

    async def _probe_loop(self) -> None:
        while self.degraded:
            await asyncio.sleep(self.probe_interval)
            try:
                await self.primary.grants()
                await self.mirror.hand_back(self.primary)  # the window's grants made here, before the return
            except FAILS:
                continue
            except Exception as e:  # noqa: BLE001 - a probe that dies would leave the proxy degraded for good
                self._warn("probe", "probing schedule store %s failed unexpectedly: %r", self.primary.name, e)
                continue
            self._returned()
            if self.mirror.local:  # granted while the hand-back was on its way
                with contextlib.suppress(*FAILS, NotImplementedError):
                    await self.mirror.hand_back(self.primary)

    async def _run(self, call: Callable[[Store], Awaitable[T]]) -> T:
        if not self.degraded:
            try:
                answer = await call(self.primary)
            except StoreBusy:
                pass  # this call only: held by another process is no outage
            except FAILS as e:
                self._degrade(e)
            else:
                self._read_when_due()  # the windows are mirrored from the first answer on, claims or none
                return answer
        return await call(self.fallback)

    # -- the primary held by another process, and the windows' mirror -------------------------------

    def _busy(self, err: StoreBusy) -> Claim:
        """A claim the primary could not take because another process holds it: wait, never fail over."""
        if self._busy_since is None:
            self._busy_since = self.monotonic()
            msg = "schedule store %s: %s; paced requests wait for it (never a fresh window)"
            log.warning(msg, self.primary.name, err)
        return Claim(Outcome.HOST_NOT_READY, BUSY_WAIT, time.time() + BUSY_WAIT)

    def _answered(self, window: WindowRule | None, c: Claim) -> Claim:
        """The primary answered a claim: count its grant in the mirror, and snapshot the shared windows
        when one is due."""
        if self._busy_since is not None:
            held = self.monotonic() - self._busy_since
            log.warning("schedule store %s is free again after %.1f s", self.primary.name, held)
            self._busy_since = None
        if c.granted:
            self.mirror.granted(window, c.wait)
        self._read_when_due()
        return c

    def _read_when_due(self) -> None:
        self.mirror.read_when_due(self.primary, self.fallback, lambda: self.degraded)

    # -- claims -----------------------------------------------------------------------------------

    def _held(self) -> Claim | None:
        hold = self._floor - self.monotonic()
        return Claim(Outcome.HOST_NOT_READY, hold, time.time() + hold) if hold > 0 else None

    def _shared_granted(self, c: Claim) -> None:
        slot = self.monotonic() + c.wait
        self._last_shared = max(self._last_shared, slot)
        if self.degraded:  # its answer came after another claim failed over: hold the local schedule
            self._floor = max(self._floor, slot + self._wide)

    def _local_granted(self, c: Claim, grace: bool) -> None:
        slot = self.monotonic() + c.wait
        self._last_local = max(self._last_local, slot)
        if grace:  # the shared schedule lies behind this slot: the first grant after the grace follows it
            self._floor = max(self._floor, slot + self._gap)
        elif not self.degraded:  # its answer came after the return
            self._floor = max(self._floor, slot + self._wide)

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
        """The shared store's fair turn holds while it answers; the fallback and the grace after an
        outage keep no turns (each proxy then paces alone, its own dispatcher sharing fairly)."""
        gap = duration(gap)
        paced = gap > 0  # a gap of 0 is no global schedule, so there is nothing to guard
        if paced:
            self._gap = gap
            if (held := self._held()) is not None:
                return held
        if not self.degraded:
            try:
                if paced and self.monotonic() < self._grace_until:
                    return await self._grace_claim(host, gap, interval, max_wait, not_before, window)
                c = await self.primary.claim(host, gap, interval, max_wait, not_before, window, fair)
            except StoreBusy as e:
                return self._busy(e)
            except FAILS as e:
                self._degrade(e)
                if paced and (held := self._held()) is not None:
                    return held
            else:
                if c.granted and paced:
                    self._shared_granted(c)
                return self._answered(window, c)
        wide = gap * self.gap_multiplier
        await self.mirror.seed(self.fallback, window)
        c = await self.fallback.claim(host, wide, interval, max_wait, not_before, self._local(window))
        if c.granted:
            self.mirror.granted_locally(window, c.wait)
            if paced:
                self._local_granted(c, grace=False)
        return c

    def _local(self, rule: WindowRule | None) -> WindowRule | None:
        """The window one proxy keeps on the fallback: the limit divided like the rate, so N proxies on
        their fallbacks keep the sum. (Grants made on the shared store just before an outage are not
        in the fallback's count: the division, not the count, keeps the sum then.)"""
        return divided(rule, self.gap_multiplier)

    async def _grace_claim(
        self,
        host: str,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float,
        window: WindowRule | None,
    ) -> Claim:
        """Just back: take the local widened slot first, then the shared slot no earlier than it, so the
        shared record moves past every grant made in the grace (other proxies claiming from it after their
        own grace then follow it, instead of landing on it)."""
        try:
            local: Claim | None = await self.fallback.claim(
                host, gap * self.gap_multiplier, interval, max_wait, not_before, self._local(window)
            )
        except FAILS:
            local = None
        if local is not None and not local.granted:
            return local
        earliest = max(not_before, local.wait if local is not None else 0.0)
        c = await self.primary.claim(host, gap, interval, max_wait, earliest, window)
        if c.granted:  # else the local slot goes unused: a gap, never a burst
            self._local_granted(c, grace=True)
        return self._answered(window, c)

    # -- feedback: recorded in the active store, and every backoff mirrored into the fallback --------

    async def _mirror(self, what: str, call: Callable[[Store], Awaitable[None]]) -> None:
        try:
            await call(self.fallback)
        except (*FAILS, NotImplementedError) as e:
            self._warn("mirror", "could not mirror a %s into %s: %r", what, self.fallback.name, e)

    async def throttled(
        self,
        host: str,
        retry_after: float | None,
        policy: BackoffPolicy,
        kind: Kind = Kind.THROTTLE,
        base: float = 0.0,
    ) -> Delay:
        if not self.degraded:
            try:
                delay = await self.primary.throttled(host, retry_after, policy, kind, base)
            except StoreBusy:
                pass  # recorded in the fallback meanwhile: a backoff must not wait for the holder
            except FAILS as e:
                self._degrade(e)
            else:
                await self._mirror("backoff", lambda s: s.mirror_backoff(host, delay.seconds))
                return delay
        return await self.fallback.throttled(host, retry_after, policy, kind, base)

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
        # Degraded, the fallback's ceiling is per proxy: widened like the gap, so N proxies keep the sum.
        if not self.degraded:
            try:
                c = await self.primary.exempt_claim(host, rate, burst, max_wait, hold, ceiling, window)
            except StoreBusy as e:
                return self._busy(e)
            except FAILS as e:
                self._degrade(e)
            else:
                return self._answered(window, c)
        wide = duration(rate) * self.gap_multiplier
        burst = max(1, int(burst / self.gap_multiplier))
        await self.mirror.seed(self.fallback, window)
        local = self._local(window)
        c = await self.fallback.exempt_claim(host, wide, burst, max_wait, hold, ceiling, local)
        if c.granted:
            self.mirror.granted_locally(window, c.wait)
        return c

    async def window_used(self, rule: WindowRule) -> int:
        """Read for the gauges every few seconds, claims or none: the windows are mirrored from then on
        (a proxy that has sent nothing yet still has a copy when the shared store goes)."""
        if self.degraded:
            return await self.fallback.window_used(rule)
        used = await self._run(lambda s: s.window_used(rule))
        if not self.degraded and rule.on:
            self.mirror.watch(rule)
            self._read_when_due()
        return used

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        if not self.degraded:
            try:
                await self.primary.set_crawl_delay(host, delay, ttl)
            except StoreBusy:
                pass
            except FAILS as e:
                self._degrade(e)
            else:
                await self._mirror("crawl-delay", lambda s: s.set_crawl_delay(host, delay, ttl))
                return
        await self.fallback.set_crawl_delay(host, delay, ttl)

    async def mirror_backoff(self, host: str, seconds: float) -> None:
        await self._run(lambda s: s.mirror_backoff(host, seconds))

    async def release(self, host: str) -> None:
        """Both stores: the fallback holds a mirror of every backoff the shared store recorded."""
        await self.fallback.release(host)
        await self._run(lambda s: s.release(host))

    async def succeeded(self, host: str) -> None:
        await self._run(lambda s: s.succeeded(host))

    def probing(self, host: str) -> bool:
        return self.primary.probing(host) or self.fallback.probing(host)

    async def host_view(self, host: str) -> HostView:
        view = await self._run(lambda s: s.host_view(host))
        if not self.degraded and view.backoff_in > 0:
            # A backoff another proxy recorded in the shared store, seen on the once-a-second read: kept
            # in the fallback too, so an outage starting now does not let this proxy send into it.
            await self._mirror("backoff", lambda s: s.mirror_backoff(host, view.backoff_in))
        return view

    async def grants(self) -> int:
        return await self._run(lambda s: s.grants())

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        await self.mirror.stop()
        await self.primary.close()
        await self.fallback.close()
