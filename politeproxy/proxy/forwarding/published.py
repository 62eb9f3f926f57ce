"""The crawls ``collinfo.json`` lists, as the shared cache holds it (issue 43): which CDX answers may be kept.

A crawl's index never changes once the crawl is published, and published means listed in collinfo.json.
The list is read from the cache's own entry of collinfo.json (kept by its rule and TTL, refreshed when a
client asks for it after the TTL), never fetched for this: no request to the index server is spent on it.
A list that is old only lacks the newest crawls, so it errs towards not keeping. It is read again when a
question names a crawl it lacks, at most once per REREAD seconds, and at once after this proxy stored a
new copy; a proxy sharing the data dir sees another's copy within REREAD.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from yarl import URL

from politeproxy.cache.store import DiskStore, Found
from politeproxy.policy.cacherules import (
    INDEX_HOSTS,
    Bypass,
    Cacheable,
    CacheLimits,
    CacheRule,
    cache_key,
    request_decision,
)
from politeproxy.policy.indexanswers import MAX_COLLINFO, published_crawls
from politeproxy.proxy.common.clientside import ClientSide

T = TypeVar("T")
REREAD = 5.0  # seconds between reads of the cached collinfo.json while questions name a crawl it lacks
COLLINFO = "/collinfo.json"


def collinfo_rule(limits: CacheLimits) -> CacheRule | None:
    """The rule that keeps the index server's collinfo.json, if the cache rules have one."""
    for rule in limits.rules:
        if rule.matches(INDEX_HOSTS[0], COLLINFO):
            return rule
    return None


class Published:
    """``crawls``: the published crawls as last read; ``refresh`` reads them again when due."""

    def __init__(
        self,
        store: DiskStore,
        run: Callable[..., Awaitable[Any]],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.run = run  # the cache front's bounded thread pool
        self.monotonic = monotonic
        self.rule = collinfo_rule(store.limits)
        self.crawls: frozenset[str] = frozenset()
        self._read_at = -float("inf")
        self._pending: asyncio.Future[None] | None = None  # the read in progress: later questions wait for it
        # seconds the index rests (set by app.py: the store's record of it, as every proxy sees it)
        self.resting: Callable[[str], Awaitable[float]] | None = None

    def decide(self, client: ClientSide, host: str, url: URL) -> Cacheable | Bypass | None:
        """The cache rules' decision for a request, on the list read last (no I/O: every request asks)."""
        return request_decision(
            self.store.limits,
            client.method,
            host,
            url.raw_path_qs,  # the target exactly as it goes upstream: the key's path
            client.headers,
            client.has_body,
            scheme=url.scheme,
            port=url.port or 0,
            published=self.crawls,
        )

    async def decide_again(
        self, client: ClientSide, host: str, url: URL, d: Bypass, on_error: Callable[[BaseException], None]
    ) -> Cacheable | Bypass | None:
        """A CDX question about a crawl not in the list read last (``d``): the list is read again (at most
        every REREAD seconds, one read for every question waiting on it) and the question decided again."""
        try:
            if not await self.refresh(url.port or 0):
                return d
        except Exception as e:  # noqa: BLE001 - an unreadable list keeps nothing, never fails a request
            on_error(e)
            return d
        return self.decide(client, host, url)

    def is_collinfo(self, rule: CacheRule, key: str) -> bool:
        return rule is self.rule and COLLINFO in key

    async def keep_stale(self, rule: CacheRule, key: str) -> bool:
        """Whether a stale entry is still served: collinfo.json while the index server rests (item 3), so
        the list is never fetched during a rest; a store that cannot say: no."""
        if self.resting is None or not self.is_collinfo(rule, key):
            return False
        try:
            return await self.resting(INDEX_HOSTS[0]) > 0
        except Exception:  # noqa: BLE001 - fetched again as usual (through the pacer)
            return False

    def forget(self) -> None:
        """A new copy was stored: the next question reads it."""
        self._read_at = -float("inf")

    async def refresh(self, port: int) -> bool:
        """Read the cached list again when REREAD passed since the last read; whether it was read (by
        this call, or by the read in progress this call waited for)."""
        if self._pending is not None:
            await asyncio.shield(self._pending)
            return True
        now = self.monotonic()
        if self.rule is None or now - self._read_at < REREAD:
            return False
        self._read_at = now
        key = cache_key("GET", self.rule.host_class, port, COLLINFO, None)
        self._pending = pending = asyncio.ensure_future(self._load(key))
        try:
            await asyncio.shield(pending)
        finally:
            if self._pending is pending:
                self._pending = None
        return True

    async def _load(self, key: str) -> None:
        crawls = await self.run(self._read, key)
        if crawls:  # a copy evicted or unreadable: published crawls stay published
            self.crawls = crawls

    def _read(self, key: str) -> frozenset[str]:
        """In a thread: the crawls of the cached collinfo.json; none when it is absent or unreadable."""
        found = self.store.lookup(key)
        if not isinstance(found, Found):
            return frozenset()
        try:
            if found.meta.length > MAX_COLLINFO:
                return frozenset()
            return published_crawls(found.f.read(found.meta.length))
        finally:
            found.f.close()
