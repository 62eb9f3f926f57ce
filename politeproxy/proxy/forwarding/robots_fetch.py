"""Fetch robots.txt per paced host, through the schedule, and keep its Crawl-delay in the store.

- 200: the body is read to its end, at most ``MAX_ROBOTS_BYTES`` (RFC 9309 asks parsers to take at least
  500 KiB); a longer file is parsed as far as the cap, the rest ignored.
- 4xx other than 429: there is no robots.txt; Crawl-delay 0 for the TTL.
- anything else (5xx, 429, a timeout, a refused or reset connection, a body cut short): a failure. The
  known Crawl-delay is kept (written back with a short TTL, so proxies sharing the store wait too) and the
  fetch is tried again after ``RETRY_AFTER_FAILURE`` seconds. A failure never lowers the delay.

Tables are bounded: at most ``MAX_FETCHES`` fetches run at once (a host past that is simply checked on a
later request), and ``MAX_HOSTS`` hosts are remembered.
"""

from __future__ import annotations

import asyncio
import logging
import time

from multidict import CIMultiDict

from politeproxy.pacing.pacer import Pacer, WaitTooLong
from politeproxy.policy import settings as defaults
from politeproxy.policy.classify import Klass
from politeproxy.policy.robots import crawl_delay, effective_crawl_delay
from politeproxy.proxy.origin.h1conn import UpstreamFailed
from politeproxy.proxy.origin.upstream import Answer, Upstream

log = logging.getLogger("politeproxy.policy.robots")

MAX_ROBOTS_BYTES = 512 * 1024
RETRY_AFTER_FAILURE = 300.0
FETCH_TIMEOUT = 30.0  # the whole fetch, body included
MAX_FETCHES = 4
MAX_HOSTS = 1024


class RobotsFailed(Exception):
    """robots.txt could not be read: keep what is known."""


class RobotsWatcher:
    def __init__(
        self,
        pacer: Pacer,
        upstream: Upstream,
        ttl: float = defaults.ROBOTS_TTL,
        cap: float = defaults.ROBOTS_MAX_CRAWL_DELAY,
        enabled: bool = defaults.ROBOTS_ENABLED,
    ) -> None:
        self.pacer = pacer
        self.upstream = upstream
        self.ttl = ttl
        self.cap = cap
        self.enabled = enabled
        self.checked_until: dict[str, float] = {}  # local monotonic: no store read per request
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def reload(self, new: defaults.RobotsSettings) -> None:
        """Apply [robots] from a reloaded config; hosts already checked keep their answer until it expires."""
        self.enabled, self.ttl, self.cap = new.enabled, new.ttl, new.max_crawl_delay

    def ensure(self, host: str) -> None:
        """Start a background refresh for ``host`` if its Crawl-delay is unknown or stale; never blocks."""
        now = time.monotonic()
        if not self.enabled or self.checked_until.get(host, 0.0) > now or host in self.tasks:
            return
        if len(self.tasks) >= MAX_FETCHES:
            return  # checked on a later request
        task = asyncio.get_running_loop().create_task(self._refresh(host))
        self.tasks[host] = task
        task.add_done_callback(lambda _t: self.tasks.pop(host, None))

    def _remember(self, host: str, until: float) -> None:
        self.checked_until.pop(host, None)
        self.checked_until[host] = until
        if len(self.checked_until) > MAX_HOSTS:
            now = time.monotonic()
            expired = [h for h, t in self.checked_until.items() if t <= now]
            for h in expired or [next(iter(self.checked_until))]:
                del self.checked_until[h]

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    async def _refresh(self, host: str) -> None:
        try:
            view = await self.pacer.host_view(host)
            if view.robots_fresh:  # another proxy sharing the store fetched it
                self._remember(host, time.monotonic() + min(self.ttl, 60.0))
                return
            try:
                delay = await self._fetch(host)
            except RobotsFailed as e:
                log.info(
                    "%s: robots.txt unavailable (%s); keeping Crawl-delay %.3gs", host, e, view.crawl_delay
                )
                await self.pacer.set_crawl_delay(host, view.crawl_delay, RETRY_AFTER_FAILURE)
                self._remember(host, time.monotonic() + RETRY_AFTER_FAILURE)
                return
            await self.pacer.set_crawl_delay(host, delay, self.ttl)
            self._remember(host, time.monotonic() + self.ttl)
            if delay:
                log.info("%s: robots.txt Crawl-delay %.3gs (cap %.3gs)", host, delay, self.cap)
        except Exception as e:  # noqa: BLE001 - robots is best effort; pacing goes on without it
            log.info("%s: robots.txt check failed: %s", host, e)
            self._remember(host, time.monotonic() + RETRY_AFTER_FAILURE)

    async def _fetch(self, host: str) -> float:
        """The capped Crawl-delay robots.txt gives; raises RobotsFailed when it could not be read."""
        try:
            async with self.pacer.permit(host, Klass.PACED) as p:
                try:
                    async with asyncio.timeout(FETCH_TIMEOUT):
                        resp = await self.upstream.request(
                            "GET", f"https://{host}/robots.txt", CIMultiDict(), None
                        )
                except (UpstreamFailed, TimeoutError, OSError) as e:
                    await p.answered(None, None)
                    raise RobotsFailed(type(e).__name__) from None
                try:
                    await p.answered(resp.status, resp.headers.get("Retry-After"))
                    if resp.status == 200:
                        return await self._parse(resp)
                    if 400 <= resp.status < 500 and resp.status != 429:
                        return 0.0  # no robots.txt: no Crawl-delay
                    raise RobotsFailed(f"status {resp.status}")
                finally:
                    if resp.at_eof():  # read to its end: the pool keeps the connection
                        resp.release()
                    else:
                        resp.close()
        except WaitTooLong as e:
            raise RobotsFailed(e.why) from None

    async def _parse(self, resp: Answer) -> float:
        """Read the body to its end, at most MAX_ROBOTS_BYTES, and take the Crawl-delay from it."""
        data = bytearray()
        try:
            async with asyncio.timeout(FETCH_TIMEOUT):
                while len(data) < MAX_ROBOTS_BYTES:
                    chunk = await resp.read(MAX_ROBOTS_BYTES - len(data))
                    if not chunk:
                        break
                    data += chunk
        except (UpstreamFailed, TimeoutError, OSError) as e:
            raise RobotsFailed(f"body: {type(e).__name__}") from None
        return effective_crawl_delay(crawl_delay(data.decode("utf-8", "replace")), self.cap)
