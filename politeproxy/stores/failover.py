"""Never fail open: when the primary store fails, pace on a local fallback with a wider gap.

N proxies that lose their shared store together each pace alone, so each multiplies the gap by
``gap_multiplier`` (``schedule.expected_proxies``) to keep the sum within the budget. The primary is
probed in the background and used again as soon as it answers.

Both switches are guarded, because the proxies do not switch at the same instant: the first local grant
waits one widened gap after the last shared one, and for a grace period after the return each grant must
also fit the local widened schedule, since other proxies may still be pacing locally.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from politeproxy.policy.backoff import BackoffPolicy, Delay
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.stores.base import HostView, Store, StoreError

log = logging.getLogger("politeproxy.store")
T = TypeVar("T")


class FailoverStore(Store):
    def __init__(
        self,
        primary: Store,
        fallback: Store,
        gap_multiplier: float = 1.0,
        probe_interval: float = 1.0,
        on_change: Callable[[Store, bool], None] | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.gap_multiplier = max(1.0, gap_multiplier)
        self.probe_interval = probe_interval
        self.on_change = on_change
        self.degraded = False
        self._warned = False
        self._probe: asyncio.Task[None] | None = None
        self._hold_until = 0.0  # monotonic: no local grant before this, after switching to the fallback
        self._grace_until = 0.0  # monotonic: after returning, grants also respect the local schedule
        self._last_gap = 0.0

    @property
    def active(self) -> Store:
        return self.fallback if self.degraded else self.primary

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.active.name

    def _degrade(self, err: BaseException) -> None:
        if self.degraded:
            return
        self.degraded = True
        self._hold_until = time.monotonic() + self._last_gap * self.gap_multiplier
        msg = "schedule store %s failed (%s); pacing on %s with the gap x%g until it answers again"
        args = (self.primary.name, err, self.fallback.name, self.gap_multiplier)
        # Warn once whatever the verbosity; later flaps go to info.
        (log.info if self._warned else log.warning)(msg, *args)
        self._warned = True
        if self.on_change:
            self.on_change(self.fallback, True)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while self.degraded:
            await asyncio.sleep(self.probe_interval)
            try:
                await self.primary.grants()
            except (StoreError, OSError, ConnectionError):
                continue
            self.degraded = False
            self._grace_until = time.monotonic() + 2 * self.probe_interval + 0.5
            log.warning("schedule store %s answers again; back on it", self.primary.name)
            if self.on_change:
                self.on_change(self.primary, False)

    async def _run(self, call: Callable[[Store], Awaitable[T]]) -> T:
        if not self.degraded:
            try:
                return await call(self.primary)
            except (StoreError, OSError, ConnectionError) as e:
                self._degrade(e)
        return await call(self.fallback)

    async def claim(self, host: str, gap: float, interval: float, max_wait: float | None) -> Claim:
        self._last_gap = gap
        if not self.degraded:
            try:
                c = await self.primary.claim(host, gap, interval, max_wait)
            except (StoreError, OSError, ConnectionError) as e:
                self._degrade(e)
            else:
                if not c.granted or time.monotonic() >= self._grace_until:
                    return c
                # Just back: the shared slot is ours, but go no faster than the local share either.
                local = await self.fallback.claim(host, gap * self.gap_multiplier, interval, max_wait)
                if not local.granted:
                    return local  # the shared slot goes unused: a gap, never a burst
                return c if c.wait >= local.wait else local
        hold = self._hold_until - time.monotonic()
        if hold > 0:
            return Claim(Outcome.HOST_NOT_READY, hold, time.time() + hold)
        return await self.fallback.claim(host, gap * self.gap_multiplier, interval, max_wait)

    async def throttled(self, host: str, retry_after: float | None, policy: BackoffPolicy) -> Delay:
        return await self._run(lambda s: s.throttled(host, retry_after, policy))

    async def succeeded(self, host: str) -> None:
        await self._run(lambda s: s.succeeded(host))

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        await self._run(lambda s: s.set_crawl_delay(host, delay, ttl))

    async def host_view(self, host: str) -> HostView:
        return await self._run(lambda s: s.host_view(host))

    async def grants(self) -> int:
        return await self._run(lambda s: s.grants())

    async def close(self) -> None:
        if self._probe:
            self._probe.cancel()
        await self.primary.close()
        await self.fallback.close()
