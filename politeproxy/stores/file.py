"""A store in the data dir, shared by every proxy (and ccrawl) pointed at that dir.

``ratelimit.lock`` holds the global record in ccrawl's format: 16 bytes, big-endian uint64 UnixNano of the
next free slot, then big-endian uint64 count of grants, read and written under ``flock(LOCK_EX)`` held only
for that read and write. Per-host state lives in ``hosts/<host>``, read and written under the same lock,
so one claim checks and reserves both atomically.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from politeproxy.policy import backoff
from politeproxy.policy.backoff import BackoffPolicy, Delay
from politeproxy.policy.slots import Claim, HostState
from politeproxy.stores.base import HostView, Store, StoreError, jitter_source
from politeproxy.stores.memory import StateMachine

GLOBAL = struct.Struct(">QQ")
# next_allowed, backoff_until, robots_expires (UnixNano), throttles, crawl_delay (ns)
HOST = struct.Struct(">QQQQQ")
NS = 1_000_000_000


def _ns(t: float) -> int:
    return max(0, round(t * NS))


def _s(ns: int) -> float:
    return ns / NS


class FileStore(Store):
    name = "file"

    def __init__(
        self,
        data_dir: Path,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = jitter_source,
    ) -> None:
        self.dir = Path(data_dir)
        self.sm = StateMachine(clock, rand)
        self.path = self.dir / "ratelimit.lock"
        self.host_dir = self.dir / "hosts"
        try:
            self.host_dir.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        self.host_fds: dict[str, int] = {}
        self.lock_timeout = 5.0
        # flock belongs to the open file description, which every coroutine here shares: two of them
        # "holding" it at once would let the first one's unlock end the second one's critical section
        # early. So one coroutine at a time takes the flock.
        self._inproc: asyncio.Lock | None = None

    # -- locking: try without blocking the loop; on contention wait in a thread ------------------------

    def _lock_nb(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as e:  # ENOLCK/EOPNOTSUPP on NFS and friends
            raise StoreError(f"cannot lock {self.path}: {e}") from e

    async def _lock(self) -> None:
        if self._lock_nb():
            return
        try:
            await asyncio.wait_for(
                asyncio.to_thread(fcntl.flock, self.fd, fcntl.LOCK_EX), timeout=self.lock_timeout
            )
        except (OSError, TimeoutError) as e:
            raise StoreError(f"cannot lock {self.path}: {e!r}") from e

    def _unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    @asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        """The flock, held for one synchronous read-modify-write."""
        if self._inproc is None:
            self._inproc = asyncio.Lock()
        async with self._inproc:
            await self._lock()
            try:
                yield
            finally:
                self._unlock()

    # -- records ----------------------------------------------------------------------------------

    def _read_global(self) -> tuple[float, int]:
        data = os.pread(self.fd, GLOBAL.size, 0)
        if len(data) < GLOBAL.size:
            return 0.0, 0
        nxt, count = GLOBAL.unpack(data)
        return _s(nxt), count

    def _write_global(self, nxt: float, count: int) -> None:
        os.pwrite(self.fd, GLOBAL.pack(_ns(nxt), count), 0)

    def _host_fd(self, host: str) -> int:
        fd = self.host_fds.get(host)
        if fd is None:
            safe = host.replace("/", "_")
            fd = os.open(self.host_dir / safe, os.O_RDWR | os.O_CREAT, 0o644)
            self.host_fds[host] = fd
        return fd

    def _read_host(self, host: str) -> HostState:
        data = os.pread(self._host_fd(host), HOST.size, 0)
        if len(data) < HOST.size:
            return HostState()
        nxt, until, robots, throttles, delay = HOST.unpack(data)
        return HostState(_s(nxt), _s(until), throttles, _s(delay), _s(robots))

    def _write_host(self, host: str, st: HostState) -> None:
        rec = HOST.pack(
            _ns(st.next_allowed),
            _ns(st.backoff_until),
            _ns(st.robots_expires),
            st.throttles,
            _ns(st.crawl_delay),
        )
        # One pwrite of 40 bytes: a kill -9 leaves the old or the new record, never half of each.
        os.pwrite(self._host_fd(host), rec, 0)

    # -- Store ------------------------------------------------------------------------------------

    async def claim(self, host: str, gap: float, interval: float, max_wait: float | None) -> Claim:
        async with self._held():
            nxt, count = self._read_global()
            st = self._read_host(host)
            c, new_next, new_st = self.sm.claim(nxt, st, gap, interval, max_wait)
            if c.granted:
                if gap > 0:
                    self._write_global(new_next, count + 1)
                else:
                    self._write_global(nxt, count + 1)
                if new_st != st:
                    self._write_host(host, new_st)
            return c

    async def throttled(self, host: str, retry_after: float | None, policy: BackoffPolicy) -> Delay:
        async with self._held():
            delay, st = self.sm.throttled(self._read_host(host), retry_after, policy)
            self._write_host(host, st)
            return delay

    async def succeeded(self, host: str) -> None:
        async with self._held():
            st = self._read_host(host)
            new = backoff.apply_success(st)
            if new is not st:
                self._write_host(host, new)

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        async with self._held():
            self._write_host(host, self.sm.with_crawl_delay(self._read_host(host), delay, ttl))

    async def host_view(self, host: str) -> HostView:
        async with self._held():
            return self.sm.view(self._read_host(host))

    async def grants(self) -> int:
        async with self._held():
            return self._read_global()[1]

    async def close(self) -> None:
        for fd in [self.fd, *self.host_fds.values()]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.host_fds.clear()
