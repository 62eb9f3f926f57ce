"""Kept index answers shared through Redis (issue 43 item 2), for the cache front
(proxy/forwarding/cached.py).

On the Redis store, proxies may each have a data dir (and a disk cache) of their own. For the index
server's kept answers the cache front then also asks Redis: a local miss is looked up there and, when
found and fresh, copied into the local cache and answered from it (``fill``); an answer this proxy kept is
put there too (``publish``); and the single flight of a question takes a lease in Redis, not only the
data dir's lease file (``lease``), so identical questions from every proxy on Redis reach the index server
once. Nobody waits across their own hold: a lease is held only while its holder asks, and a waiter polls
it for at most ``pacing.max_wait`` and then asks itself. Redis down: the data dir's lease and cache only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from politeproxy.cache.redis_answers import Kept, RedisAnswers
from politeproxy.cache.store import INDEX_KIND, LEASE_REFRESH, DiskStore, Found
from politeproxy.policy.cacherules import Cacheable, entry_ttl, fresh

LEASE_POLL = 0.05  # seconds between looks at a lease another proxy holds in Redis
HELD_MAX = 4096  # leases this proxy holds at once at most (each one a question in flight)


class IndexShare:
    def __init__(self, answers: RedisAnswers, store: DiskStore, run: Callable[..., Awaitable[Any]]) -> None:
        self.answers = answers
        self.store = store
        self.run = run  # the cache front's bounded thread pool
        self.held: dict[str, asyncio.Task[None]] = {}  # key -> the refresher of a lease held here
        self._dropping: set[asyncio.Task[None]] = set()

    async def fill(self, d: Cacheable) -> bool:
        """Copy a fresh answer Redis holds for ``d`` into the local cache; whether one was copied."""
        kept = await self.answers.get(d.key)
        if kept is None or not fresh(
            entry_ttl(self.store.limits, d.rule, kept.status), kept.stored, time.time()
        ):
            return False
        await self.run(self._write, d.key, kept)
        return True

    def _write(self, key: str, kept: Kept) -> None:
        w = self.store.writer(key)
        w.write(kept.body)
        self.store.commit(w, key, kept.status, kept.headers, len(kept.body), INDEX_KIND, kept.stored)

    async def publish(self, d: Cacheable) -> None:
        """Put the answer just kept on disk for ``d`` into Redis, for proxies with data dirs of their own."""
        found = await self.run(self.store.lookup, d.key)
        if not isinstance(found, Found):
            return
        try:
            meta = found.meta
            if meta.length > self.answers.max_answer:
                return
            body = await self.run(found.f.read, meta.length)
        finally:
            found.f.close()
        if len(body) == meta.length:
            await self.answers.put(d.key, meta.status, list(meta.headers), body, meta.stored)

    async def lease(self, key: str, max_wait: float) -> bool:
        """Take ``key``'s lease in Redis, polling one another proxy holds for at most ``max_wait``; True
        once taken or waited out (the caller looks again, then asks), False when Redis cannot say."""
        deadline = time.monotonic() + max_wait
        while True:
            took = await self.answers.take_lease(key)
            if took is None:
                return False
            if took:
                if len(self.held) < HELD_MAX and key not in self.held:
                    self.held[key] = asyncio.get_running_loop().create_task(self._refresh(key))
                return True
            if time.monotonic() >= deadline or await self.answers.has(key):
                return True
            await asyncio.sleep(LEASE_POLL)

    async def _refresh(self, key: str) -> None:
        while True:
            await asyncio.sleep(LEASE_REFRESH)
            await self.answers.refresh_lease(key)

    def release(self, key: str) -> None:
        """The question is answered (kept or not): its lease goes, so waiters look again."""
        task = self.held.pop(key, None)
        if task is not None:
            task.cancel()
            drop = asyncio.get_running_loop().create_task(self.answers.drop_lease(key))
            self._keep(drop)

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def close(self) -> None:
        for key in list(self.held):
            self.release(key)
        if self._dropping:
            await asyncio.wait(set(self._dropping), timeout=1.0)
