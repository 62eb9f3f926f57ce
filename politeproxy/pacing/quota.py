"""What is left of each service's budget, as the RateLimit fields tell a client (issue 41).

The request window's count lives in the store, shared by every proxy on it; asking the store on every answer
would add a store call per request. So each service's count is read at most every ``FRESH`` seconds, in a
task of its own while answers use the last reading; an answer waits for a read only when the last one is
older than ``STALE`` (or there is none). At 20 requests/s a reading ``FRESH`` old is 5 requests behind:
0.1 % of Common Crawl's window. With the window off, the service's paced rate is told as a one-second quota.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.answers import Quota, rate_quota, window_quota
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import Store

log = logging.getLogger("politeproxy.pacing.pacer")

FRESH = 0.25  # seconds a reading is used before it is read again (in the background)
STALE = 2.0  # seconds after which an answer waits for a new reading
READ_TIMEOUT = 0.5  # an answer waits at most this long for the store; then it goes without the fields
MAX_SERVICES = 64  # readings kept (services are few; names under a paced pattern are client-chosen)


class Quotas:
    """Per service: the last count of its window and when it was read (the pacer's clock)."""

    def __init__(
        self,
        store: Store,
        settings: Callable[[], PacingSettings],
        monotonic: Callable[[], float],
        wait_of: Callable[[str], float],
    ) -> None:
        self._store = store
        self._settings = settings
        self._monotonic = monotonic
        self._wait_of = wait_of  # how long a request for a host asked now would wait (the queue's estimate)
        self._read: dict[str, tuple[int, float]] = {}
        self._reading: dict[str, asyncio.Task[None]] = {}

    def _window(self, host: str) -> WindowRule | Quota:
        """``host``'s window, or with windows off its paced rate as a one-second quota."""
        s = self._settings()
        rule = s.window_for(host)
        return rule if rule is not None else rate_quota(s.pace_for(host), self._wait_of(host))

    async def quota(self, host: str) -> Quota | None:
        """``host``'s service quota now; None when the store could not say in time."""
        rule = self._window(host)
        if isinstance(rule, Quota):
            return rule
        now = self._monotonic()
        last = self._read.get(rule.service)
        if last is None or now - last[1] > STALE:
            await self._wait_read(rule)
            last = self._read.get(rule.service)
            if last is None:
                return None
        elif now - last[1] > FRESH:
            self._start_read(rule)
        return window_quota(rule.limit, rule.seconds, last[0])

    def cached(self, host: str) -> Quota | None:
        """The last reading without any wait (a cache hit, which asks nothing of the pacer)."""
        rule = self._window(host)
        if isinstance(rule, Quota):
            return rule
        last = self._read.get(rule.service)
        if last is None or self._monotonic() - last[1] > FRESH:
            self._start_read(rule)
        return None if last is None else window_quota(rule.limit, rule.seconds, last[0])

    async def _wait_read(self, rule: WindowRule) -> None:
        task = self._start_read(rule)
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                await asyncio.shield(task)
        except (TimeoutError, Exception):  # noqa: BLE001 - the answer goes without the fields
            pass

    def _start_read(self, rule: WindowRule) -> asyncio.Task[None]:
        task = self._reading.get(rule.service)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read_one(rule))
            self._reading[rule.service] = task
        return task

    async def _read_one(self, rule: WindowRule) -> None:
        try:
            used = await self._store.window_used(rule)
        except Exception as e:  # noqa: BLE001 - a store fault: the last reading stays, and ages
            log.debug("window count of %s: %s", rule.service, e)
        else:
            self._read.pop(rule.service, None)
            self._read[rule.service] = (max(0, int(used)), self._monotonic())
            while len(self._read) > MAX_SERVICES:
                del self._read[next(iter(self._read))]
        finally:
            self._reading.pop(rule.service, None)

    async def close(self) -> None:
        tasks = list(self._reading.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
