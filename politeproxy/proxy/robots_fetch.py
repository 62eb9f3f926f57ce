"""Fetch robots.txt per paced host, through the schedule, and keep its Crawl-delay in the store."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from multidict import CIMultiDict

from politeproxy.pacing.pacer import Pacer, WaitTooLong
from politeproxy.policy.robots import crawl_delay, effective_crawl_delay
from politeproxy.proxy.upstream import Upstream

log = logging.getLogger("politeproxy.policy.robots")

MAX_ROBOTS_BYTES = 512 * 1024
RETRY_AFTER_FAILURE = 300.0


class RobotsWatcher:
    def __init__(
        self, pacer: Pacer, upstream: Upstream, ttl: float, cap: float, enabled: bool = True
    ) -> None:
        self.pacer = pacer
        self.upstream = upstream
        self.ttl = ttl
        self.cap = cap
        self.enabled = enabled
        self.checked_until: dict[str, float] = {}  # local monotonic: no store read per request
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def ensure(self, host: str) -> None:
        """Start a background refresh for ``host`` if its Crawl-delay is unknown or stale; never blocks."""
        if not self.enabled or self.checked_until.get(host, 0.0) > time.monotonic() or host in self.tasks:
            return
        task = asyncio.get_running_loop().create_task(self._refresh(host))
        self.tasks[host] = task
        task.add_done_callback(lambda _t: self.tasks.pop(host, None))

    async def _refresh(self, host: str) -> None:
        try:
            view = await self.pacer.host_view(host)
            if view.robots_fresh:  # another proxy sharing the store fetched it
                self.checked_until[host] = time.monotonic() + min(self.ttl, 60.0)
                return
            delay, ttl = await self._fetch(host)
            await self.pacer.store.set_crawl_delay(host, delay, ttl)
            self.checked_until[host] = time.monotonic() + ttl
            if delay:
                log.info("%s: robots.txt Crawl-delay %.3gs (cap %.3gs)", host, delay, self.cap)
        except Exception as e:  # noqa: BLE001 - robots is best effort; pacing goes on without it
            log.info("%s: robots.txt check failed: %s", host, e)
            self.checked_until[host] = time.monotonic() + RETRY_AFTER_FAILURE

    async def _fetch(self, host: str) -> tuple[float, float]:
        try:
            await self.pacer.wait_paced(host)
        except WaitTooLong:
            return 0.0, RETRY_AFTER_FAILURE
        try:
            resp = await self.upstream.request("GET", f"https://{host}/robots.txt", CIMultiDict(), None)
        except (aiohttp.ClientError, TimeoutError, OSError):
            await self.pacer.record(host, None, None)
            return 0.0, RETRY_AFTER_FAILURE
        try:
            await self.pacer.record(host, resp.status, None)
            if resp.status != 200:
                return 0.0, self.ttl
            data = await resp.content.read(MAX_ROBOTS_BYTES)  # bounded: robots files are small
            found = crawl_delay(data.decode("utf-8", "replace"))
            return effective_crawl_delay(found, self.cap), self.ttl
        finally:
            resp.close()
