"""The cache-aware exchange: answer from the shared disk cache, or go upstream once and keep the answer.

The forwarder hands every request here with the exchange it would make (``go``). A hit is answered from
disk before the pacer is asked: no slot, no exempt place. A miss goes upstream through ``go`` with a tee
that relay() feeds while the answer streams to the client; the tee's file is renamed into place only
when every expected byte came through.

Concurrent identical misses make one upstream request (issue 25: per key, never a lock shared by keys).
In this process the first is the leader of the key's flight (proxy/forwarding/flight.py); up to MAX_FOLLOWERS
others follow it, streaming its body from disk as it arrives; more, or one whose leader has no head within
max_wait, go upstream themselves. Between processes the leader holds the key's lease file (O_EXCL,
cache/store.py); a proxy that finds it held polls it from the loop (LEASE_POLL) for at most max_wait,
then looks again (a hit) or goes itself. Nothing waits in a thread and nothing is held across another
key's queue wait or download.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from multidict import CIMultiDict
from yarl import URL

from politeproxy.cache.base import CacheError, CacheEvents
from politeproxy.cache.redis_answers import RedisAnswers
from politeproxy.cache.store import DiskStore, Found, key_name
from politeproxy.policy.cacherules import (
    Bypass,
    Cacheable,
    CacheLimits,
    accepts,
    age_seconds,
    entry_ttl,
    fresh,
)
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.clientside import ClientSide, Own
from politeproxy.proxy.common.exchange import Exchange
from politeproxy.proxy.common.passage import stamp
from politeproxy.proxy.forwarding.cachetee import Tee
from politeproxy.proxy.forwarding.flight import Flight, follow, take_lease
from politeproxy.proxy.forwarding.indexshare import IndexShare
from politeproxy.proxy.forwarding.published import Published
from politeproxy.proxy.forwarding.speak import standard_fields

log = logging.getLogger("politeproxy")
T = TypeVar("T")
IO_WORKERS = 8  # disk reads and writes; bounded, so a slow disk queues work instead of growing threads
MAX_FOLLOWERS = 256  # requests that follow one key's leader; more go upstream themselves (bounded memory)
HEAD_MARGIN = 5.0  # seconds a follower waits for the head beyond max_wait (the leader's connect, first byte)
HIT_CHUNK = 1 << 20  # a hit reads 1 MiB per thread hop (measured: fewer hops, same RSS order)
SIZE_EVERY = 15.0  # seconds between reads of the whole cache's size for the gauge
IO_TIMEOUT = 30.0  # a disk call that takes longer is given up (the answer goes upstream or is cut)
Go = Callable[[], Awaitable[Own | None]]  # the exchange upstream: the proxy's own answer, or None
REFUSED = ("max_wait", "queue_full", "local_error")  # notes of an exchange that never reached upstream


def _index(d: Cacheable, result: str) -> str | None:
    """``result`` for an index question's metrics (issue 43), None for any other request."""
    return result if d.rule.cdx else None


class CacheFront:
    """Owns the store, its threads and the in-process single flight; one per proxy process."""

    def __init__(
        self, store: DiskStore, events: CacheEvents, max_wait: float, shared: RedisAnswers | None = None
    ) -> None:
        self.store = store
        self.limits: CacheLimits = store.limits
        self.events = events
        self.max_wait = max_wait
        self.io = ThreadPoolExecutor(IO_WORKERS, thread_name_prefix="cache-io")
        self.flights: dict[str, Flight] = {}  # key name -> its fetch; bounded by requests in flight
        self._disk_warned = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._sizer: asyncio.Task[None] | None = None
        self.published = Published(store, self.run)  # the crawls whose CDX answers may be kept (issue 43)
        self.share = IndexShare(shared, store, self.run) if shared is not None else None  # on Redis

    @classmethod
    async def open(
        cls,
        limits: CacheLimits,
        data_dir: Path,
        events: CacheEvents,
        max_wait: float,
        shared: RedisAnswers | None = None,
    ) -> CacheFront | None:
        """The cache in ``<data_dir>/cache``; None when disabled, or (one warning) when unusable."""
        if not limits.enabled:
            return None
        try:
            store = await asyncio.to_thread(DiskStore, data_dir / "cache", limits)
        except CacheError as e:
            log.warning("%s; running without the cache", e)
            return None
        front = cls(store, events, max_wait, shared)
        try:
            await front.run(store.sweep)  # parts of writers killed mid-write, files the index lost
        except Exception as e:  # noqa: BLE001 - a failed sweep leaves garbage, never a wrong answer
            log.warning("cache sweep of %s failed: %s", store.root, e)
        await front.report_size()
        front._sizer = asyncio.get_running_loop().create_task(front._report_every(SIZE_EVERY))
        return front

    async def _report_every(self, seconds: float) -> None:
        """The size gauge follows the other proxies' writes and evictions too (one SUM in the index)."""
        while True:
            await asyncio.sleep(seconds)
            await self.report_size()

    async def close(self) -> None:
        if self._sizer is not None:
            self._sizer.cancel()
            await asyncio.gather(self._sizer, return_exceptions=True)
        if self._tasks:  # commits in flight: bounded by IO_TIMEOUT each
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for flight in list(self.flights.values()):
            self._land(flight, False)
        if self.share is not None:
            await self.share.close()
        self.io.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.store.close)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self.io, fn, *args), IO_TIMEOUT)

    async def report_size(self) -> None:
        try:
            _n, nbytes = await self.run(self.store.totals)
        except Exception as e:  # noqa: BLE001 - a gauge must not fail a request
            log.debug("cache size: %s", e)
            return
        self.events.cache_size(nbytes)

    async def exchange(
        self, client: ClientSide, klass: Klass, host: str, url: URL, ex: Exchange, go: Go
    ) -> Own | None:
        """Answer ``client`` from the cache, or through ``go`` (the pacer and the upstream); the proxy's
        own answer when there is one to send."""
        if klass is Klass.PASSTHROUGH:
            return await go()
        d = self.published.decide(client, host, url)
        if isinstance(d, Bypass) and d.reason == "unpublished":  # a crawl the list read last lacks
            d = await self.published.decide_again(client, host, url, d, self.disk_problem)
        if d is None:
            return await go()
        if isinstance(d, Bypass):
            self._result(ex, "bypass")
            return await go()
        if d.refresh:  # the client's no-cache: fetch again and replace
            self._result(ex, "miss")
            return await self._fetch(d, ex, go)
        found = await self._lookup(d, client.headers)
        if isinstance(found, Found):
            await self._hit(client, found, ex, _index(d, "kept"))
            return None
        if found == "encoding":
            self._result(ex, "bypass")
            return await go()  # the client cannot take the stored coding: relayed, not stored
        miss = "stale" if found in ("stale", "corrupt") else "miss"
        return await self._single_flight(client, d, ex, go, miss)

    def _result(self, ex: Exchange, result: str) -> None:
        ex.cache = result
        self.events.cache_result(result, ex.pipeline)

    async def _lookup(self, d: Cacheable, req_headers: Mapping[str, str]) -> Found | str:
        """A fresh entry the client can take, else "absent", "stale", "corrupt", "encoding" or "error"."""
        try:
            found = await self.run(self.store.lookup, d.key)
            if found == "absent" and self.share is not None and d.rule.cdx and await self.share.fill(d):
                found = await self.run(self.store.lookup, d.key)  # another proxy's, through Redis
        except Exception as e:  # noqa: BLE001 - a disk or index failure is a miss, never an error answer
            self.disk_problem(e)
            return "error"
        if not isinstance(found, Found):
            return found
        why = None
        if not fresh(entry_ttl(self.limits, d.rule, found.meta.status), found.meta.stored, time.time()):
            why = None if await self.published.keep_stale(d.rule, d.key) else "stale"
        coding = dict(found.meta.headers).get("Content-Encoding", "")
        if why is None and not accepts(req_headers.get("Accept-Encoding"), coding):
            why = "encoding"
        if why is not None:
            self.bg(found.f.close)
            return why
        return found

    async def _single_flight(
        self, client: ClientSide, d: Cacheable, ex: Exchange, go: Go, miss: str
    ) -> Own | None:
        """One upstream request for concurrent identical misses; ``miss`` is how the first look counted."""
        name = key_name(d.key)
        flight = self.flights.get(name)
        if flight is not None:
            return await self._follow(client, d, ex, go, miss, flight)
        flight = self.flights[name] = Flight(d.key, name, self.max_wait + HEAD_MARGIN)
        handed = False
        try:
            if not d.rule.cdx:  # an index question takes its lease once its turn came (_turn)
                await take_lease(self, flight, self.max_wait)
            # Look again, lease held or not: another proxy (or a flight here that ended while we looked
            # the first time) may have stored it since.
            found = await self._lookup(d, client.headers)
            if isinstance(found, Found):
                self._land(flight, True)
                await self._hit(client, found, ex, _index(d, "shared"))
                return None
            self._result(ex, miss)
            flight.fetching(self.max_wait + HEAD_MARGIN)  # the pacer's wait is bounded by max_wait too
            handed = True  # _fetch lands the flight once its copy is stored or dropped
            return await self._fetch(d, ex, go, flight, client)
        finally:
            if not handed:
                self._land(flight, False)

    async def _follow(
        self, client: ClientSide, d: Cacheable, ex: Exchange, go: Go, miss: str, flight: Flight
    ) -> Own | None:
        """Stream the leader's answer; when it cannot be followed, a hit if it was stored, else upstream."""
        if flight.followers < MAX_FOLLOWERS:
            flight.followers += 1
            try:
                served = functools.partial(self._served, ex, _index(d, "shared"))
                followed = await follow(self, client, flight, ex, served)
            finally:
                flight.followers -= 1
            if followed:
                return None
            found = await self._lookup(d, client.headers)
            if isinstance(found, Found):
                await self._hit(client, found, ex, _index(d, "shared"))
                return None
        self._result(ex, miss)
        return await self._fetch(d, ex, go)  # on its own: a copy it stores replaces the entry

    async def _turn(self, client: ClientSide, d: Cacheable, ex: Exchange, flight: Flight) -> bool:
        """An index question's turn came (issue 43): its lease is taken now, never across the queue wait,
        so the asker whose turn comes first asks; when another proxy asked meanwhile (its lease held: wait
        for it, within max_wait), the answer it kept is sent instead (True: no request upstream)."""
        try:
            if not (self.share is not None and await self.share.lease(d.key, self.max_wait)):
                await take_lease(self, flight, self.max_wait)
            found = await self._lookup(d, client.headers)
        except Exception as e:  # noqa: BLE001 - no lease or no look: this asker asks, never an error answer
            self.disk_problem(e)
            return False
        if not isinstance(found, Found):
            return False
        await self._hit(client, found, ex, "shared", counted=True)  # its look counted a miss, its slot spent
        return True

    def _land(self, flight: Flight, stored: bool) -> None:
        """The flight is over: its followers learn the outcome, and its lease goes. Idempotent."""
        flight.end(stored)
        if self.share is not None:
            self.share.release(flight.key)  # its Redis lease, if it held one
        if self.flights.get(flight.name) is flight:
            del self.flights[flight.name]
        if flight.refresher is not None:
            flight.refresher.cancel()
            flight.refresher = None
        if flight.leased:
            flight.leased = False
            self.bg(functools.partial(self.store.drop_lease, flight.key))

    async def _fetch(
        self,
        d: Cacheable,
        ex: Exchange,
        go: Go,
        flight: Flight | None = None,
        client: ClientSide | None = None,
    ) -> Own | None:
        tee = Tee(self, d, flight)
        if d.rule.cdx and flight is not None and client is not None:  # the leader of an index question
            tee.gate = functools.partial(self._turn, client, d, ex, flight)
        ex.tee = tee
        try:
            resp = await go()
        except asyncio.CancelledError:
            # The client left, perhaps right after its last byte: a copy that is complete is still kept
            # (the commit checks the length in its thread); anything shorter is dropped there.
            self._commit(tee, True, flight)
            raise
        except BaseException:
            tee.discard()
            if flight is not None:
                self._land(flight, False)
            raise
        finally:
            ex.tee = None
        if d.rule.cdx and ex.note not in REFUSED and ex.cache != "hit":
            self.events.index_question("asked", ex.pipeline)
        ok = ex.note is None and ex.status == tee.status
        await asyncio.shield(self._commit(tee, ok, flight))  # followers end with the copy in place
        return resp

    def _commit(self, tee: Tee, ok: bool, flight: Flight | None) -> asyncio.Task[None]:
        """The commit as a task that outlives its request (referenced here until done); the flight lands
        when it is done, so late followers find the entry in place."""
        task = asyncio.get_running_loop().create_task(self._finish(tee, ok, flight))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _finish(self, tee: Tee, ok: bool, flight: Flight | None) -> None:
        stored = False
        try:
            stored = await tee.finish(ok)
            if stored and self.published.is_collinfo(tee.d.rule, tee.d.key):
                self.published.forget()  # a new list: the next question reads it
            if stored and self.share is not None and tee.d.rule.cdx:
                await self.share.publish(tee.d)  # before the lease goes: its waiters find it
        finally:
            if flight is not None:
                self._land(flight, stored)

    def _served(self, ex: Exchange, index: str | None) -> None:
        self._result(ex, "hit")
        self.events.cache_slot_saved(ex.pipeline)  # a request never sent
        if index is not None:
            self.events.index_question(index, ex.pipeline)

    async def _hit(
        self, client: ClientSide, found: Found, ex: Exchange, index: str | None = None, counted: bool = False
    ) -> None:
        """Answer from disk with the stored headers plus Age and Via; never a short body. ``index``: how
        an index question was answered (issue 43), for the metrics; ``counted``: its result already was."""
        ex.cache = "hit"
        if not counted:
            self._result(ex, "hit")
            self.events.cache_slot_saved(ex.pipeline)  # paced or exempt alike: a request never sent
        if index is not None:
            self.events.index_question(index, ex.pipeline)
        meta = found.meta
        headers: CIMultiDict[str] = CIMultiDict(meta.headers)
        headers["Age"] = str(age_seconds(meta.stored, time.time()))
        stamp(headers)
        standard_fields(headers, ex)
        ex.status = meta.status
        client.start(meta.status, None, headers)
        ahead: asyncio.Task[bytes] | None = None
        try:
            left = meta.length
            ahead = self._read(found, left)
            while ahead is not None:
                chunk = await ahead
                if not chunk:  # the file changed under us (never expected): a cut, never a short body
                    raise OSError("cache entry ended early")
                left -= len(chunk)
                ahead = self._read(found, left)  # the next read runs while this chunk goes out
                await client.write(chunk)
                ex.bytes += len(chunk)
            await client.end()
        except ConnectionError:
            ex.note = "client_gone"
        except (OSError, TimeoutError) as e:
            ex.note = "cache_read_failed"
            log.warning("cache read failed mid-answer (%s): the client connection is cut", e)
            client.abort()
        finally:
            if ahead is not None:
                ahead.cancel()
            self.bg(found.f.close)  # a read still in a thread ends with EBADF or its bytes, unused

    def _read(self, found: Found, left: int) -> asyncio.Task[bytes] | None:
        """The next chunk's read as a task (one MiB at most), None when nothing is left."""
        if left <= 0:
            return None
        return asyncio.ensure_future(self.run(found.f.read, min(HIT_CHUNK, left)))

    def bg(self, fn: Callable[[], object]) -> None:
        """A small disk call nobody waits for (close, unlink); dropped once the pool is shut down."""
        try:
            self.io.submit(fn)
        except RuntimeError:
            pass

    def disk_problem(self, e: BaseException) -> None:
        now = time.monotonic()
        if now - self._disk_warned > 60.0:  # one line a minute: a full disk repeats on every request
            self._disk_warned = now
            log.warning("cache: %s: %s (answering from upstream)", type(e).__name__, e)
