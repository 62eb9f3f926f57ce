"""The cache-aware exchange: answer from the shared disk cache, or go upstream once and keep the answer.

The forwarder hands every request here with the exchange it would make (``go``). A hit is answered from
disk before the pacer is asked: no slot, no exempt place. A miss goes upstream through ``go`` with a tee
that relay() feeds while the answer streams to the client; the tee's file is renamed into place only
when every expected byte came through. Concurrent identical misses make one upstream request: in this
process they wait on the leader's future, across processes on a flock'd stripe (taken in a thread with
a bounded wait). A waiter the leader cannot serve goes upstream itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from politeproxy.cache.base import CacheError, CacheEvents
from politeproxy.cache.store import DiskStore, Found, key_name
from politeproxy.policy.cacherules import (
    Bypass,
    Cacheable,
    CacheLimits,
    accepts,
    age_seconds,
    fresh,
    request_decision,
)
from politeproxy.policy.classify import Klass
from politeproxy.proxy.cachetee import Tee
from politeproxy.proxy.exchange import Exchange
from politeproxy.proxy.passage import stamp

log = logging.getLogger("politeproxy")
T = TypeVar("T")
IO_WORKERS = 8  # disk reads and writes; bounded, so a slow disk queues work instead of growing threads
LOCK_WORKERS = 16  # threads waiting on another process's stripe lock (each bounded by max_wait)
HIT_CHUNK = 1 << 20  # a hit reads 1 MiB per thread hop (measured: fewer hops, same RSS order)
SIZE_EVERY = 15.0  # seconds between reads of the whole cache's size for the gauge
IO_TIMEOUT = 30.0  # a disk call that takes longer is given up (the answer goes upstream or is cut)
Go = Callable[[], Awaitable[web.StreamResponse]]


class CacheFront:
    """Owns the store, its threads and the in-process single flight; one per proxy process."""

    def __init__(self, store: DiskStore, events: CacheEvents, max_wait: float) -> None:
        self.store = store
        self.limits: CacheLimits = store.limits
        self.events = events
        self.max_wait = max_wait
        self.io = ThreadPoolExecutor(IO_WORKERS, thread_name_prefix="cache-io")
        self.lockers = ThreadPoolExecutor(LOCK_WORKERS, thread_name_prefix="cache-lock")
        self.flights: dict[str, asyncio.Future[None]] = {}  # key name -> done; bounded by requests in flight
        self._disk_warned = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._sizer: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, limits: CacheLimits, data_dir: Path, events: CacheEvents, max_wait: float
    ) -> CacheFront | None:
        """The cache in ``<data_dir>/cache``; None when disabled, or (one warning) when unusable."""
        if not limits.enabled:
            return None
        try:
            store = await asyncio.to_thread(DiskStore, data_dir / "cache", limits)
        except CacheError as e:
            log.warning("%s; running without the cache", e)
            return None
        front = cls(store, events, max_wait)
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
        self.io.shutdown(wait=False, cancel_futures=True)
        self.lockers.shutdown(wait=False, cancel_futures=True)
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
        self, request: web.BaseRequest, klass: Klass, host: str, url: URL, ex: Exchange, go: Go
    ) -> web.StreamResponse:
        """Answer ``request`` from the cache, or through ``go`` (the pacer and the upstream)."""
        if klass is Klass.PASSTHROUGH:
            return await go()
        d = request_decision(
            self.limits,
            request.method,
            host,
            url.raw_path_qs,  # the target exactly as it goes upstream: the key's path
            request.headers,
            request.body_exists,
            scheme=url.scheme,
            port=url.port or 0,
        )
        if d is None:
            return await go()
        if isinstance(d, Bypass):
            self._result(ex, "bypass")
            return await go()
        if d.refresh:  # the client's no-cache: fetch again and replace
            self._result(ex, "miss")
            return await self._fetch(request, d, ex, go)
        found = await self._lookup(d, request.headers)
        if isinstance(found, Found):
            return await self._hit(request, klass, found, ex)
        if found == "encoding":
            self._result(ex, "bypass")
            return await go()  # the client cannot take the stored coding: relayed, not stored
        miss = "stale" if found in ("stale", "corrupt") else "miss"
        return await self._single_flight(request, klass, d, ex, go, miss)

    def _result(self, ex: Exchange, result: str) -> None:
        ex.cache = result
        self.events.cache_result(result, ex.pipeline)

    async def _lookup(self, d: Cacheable, req_headers: Mapping[str, str]) -> Found | str:
        """A fresh entry the client can take, else "absent", "stale", "corrupt", "encoding" or "error"."""
        try:
            found = await self.run(self.store.lookup, d.key)
        except Exception as e:  # noqa: BLE001 - a disk or index failure is a miss, never an error answer
            self.disk_problem(e)
            return "error"
        if not isinstance(found, Found):
            return found
        why = None
        if not fresh(d.rule.ttl, found.meta.stored, time.time()):
            why = "stale"
        coding = dict(found.meta.headers).get("Content-Encoding", "")
        if why is None and not accepts(req_headers.get("Accept-Encoding"), coding):
            why = "encoding"
        if why is not None:
            self.bg(found.f.close)
            return why
        return found

    async def _single_flight(
        self, request: web.BaseRequest, klass: Klass, d: Cacheable, ex: Exchange, go: Go, miss: str
    ) -> web.StreamResponse:
        """One upstream request for concurrent identical misses; ``miss`` is how the first look counted."""
        name = key_name(d.key)
        leader = self.flights.get(name)
        if leader is not None:  # the same miss is on its way upstream in this process: wait for it
            try:
                await asyncio.wait_for(asyncio.shield(leader), self.max_wait)
            except TimeoutError:
                pass
            found = await self._lookup(d, request.headers)
            if isinstance(found, Found):
                return await self._hit(request, klass, found, ex)
            self._result(ex, miss)
            return await self._fetch(request, d, ex, go)  # the leader failed: go ourselves
        flight = _Flight(self, name)
        try:
            flight.lock = await self._lock(d.key)
            # Look again with the lock held, contended or not: another proxy (or a flight here that ended
            # while we looked the first time) may have stored it since.
            if flight.lock is not None:
                found = await self._lookup(d, request.headers)
                if isinstance(found, Found):
                    flight.release()
                    return await self._hit(request, klass, found, ex)
            self._result(ex, miss)
            return await self._fetch(request, d, ex, go, flight)
        finally:
            if not flight.deferred:
                flight.release()

    async def _lock(self, key: str) -> tuple[int, bool] | None:
        """The key's stripe lock across processes, waited for at most max_wait; None: go without it."""
        abandoned = threading.Event()
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(
            self.lockers, self.store.lock, key, time.monotonic() + self.max_wait, abandoned
        )
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            abandoned.set()  # the thread gives up at its next poll; a lock it got anyway is released
            fut.add_done_callback(lambda f: _release_late(self.store, f))
            raise
        except Exception as e:  # noqa: BLE001 - no lock file: single flight in this process only
            self.disk_problem(e)
            return None

    async def _fetch(
        self,
        request: web.BaseRequest,
        d: Cacheable,
        ex: Exchange,
        go: Go,
        flight: _Flight | None = None,
    ) -> web.StreamResponse:
        tee = Tee(self, d)
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
            raise
        finally:
            ex.tee = None
        ok = ex.note is None and ex.status == tee.status
        await asyncio.shield(self._commit(tee, ok, flight))  # waiters look as soon as it is in place
        return resp

    def _commit(self, tee: Tee, ok: bool, flight: _Flight | None) -> asyncio.Task[None]:
        """The commit as a task that outlives its request (referenced here until done); the flight's
        waiters and lock are let go only when it is done, so they find the entry in place."""
        task = asyncio.get_running_loop().create_task(tee.finish(ok))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if flight is not None:
            flight.deferred = True
            task.add_done_callback(flight.release)
        return task

    async def _hit(
        self, request: web.BaseRequest, klass: Klass, found: Found, ex: Exchange
    ) -> web.StreamResponse:
        """Answer from disk with the stored headers plus Age and Via; never a short body."""
        self._result(ex, "hit")
        self.events.cache_slot_saved(ex.pipeline)  # paced or exempt alike: a request never sent
        meta = found.meta
        headers: CIMultiDict[str] = CIMultiDict(meta.headers)
        headers["Age"] = str(age_seconds(meta.stored, time.time()))
        stamp(headers)
        ex.status = meta.status
        out = web.StreamResponse(status=meta.status, headers=headers)
        ahead: asyncio.Task[bytes] | None = None
        try:
            await out.prepare(request)
            left = meta.length
            ahead = self._read(found, left)
            while ahead is not None:
                chunk = await ahead
                if not chunk:  # the file changed under us (never expected): a cut, never a short body
                    raise OSError("cache entry ended early")
                left -= len(chunk)
                ahead = self._read(found, left)  # the next read runs while this chunk goes out
                await out.write(chunk)
                ex.bytes += len(chunk)
            await out.write_eof()
        except (ConnectionError, aiohttp.ClientError):
            ex.note = "client_gone"
        except (OSError, TimeoutError) as e:
            ex.note = "cache_read_failed"
            log.warning("cache read failed mid-answer (%s): the client connection is cut", e)
            if request.transport is not None:
                request.transport.abort()
        finally:
            if ahead is not None:
                ahead.cancel()
            self.bg(found.f.close)  # a read still in a thread ends with EBADF or its bytes, unused
        return out

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


class _Flight:
    """A leader's hold on a key: the future its in-process waiters wait on and the stripe lock other
    processes wait on. Released once: when the answer is in place or failed."""

    def __init__(self, front: CacheFront, name: str) -> None:
        self.front, self.name = front, name
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        front.flights[name] = self.done
        self.lock: tuple[int, bool] | None = None
        self.deferred = False  # the commit task releases it

    def release(self, *_task: object) -> None:
        if self.lock is not None:
            self.front.store.unlock(self.lock[0])
            self.lock = None
        if self.front.flights.get(self.name) is self.done:
            del self.front.flights[self.name]
        if not self.done.done():
            self.done.set_result(None)


def _release_late(store: DiskStore, f: asyncio.Future[tuple[int, bool] | None]) -> None:
    if not f.cancelled() and f.exception() is None:
        got = f.result()
        if got is not None:
            store.unlock(got[0])
