"""The tee of a cache miss: relay() feeds it the answer's head and each chunk as they go to the client; it
writes a storable answer to a temporary file, and its commit renames the file into place only when every
announced byte came through (proxy/cached.py makes and finishes it). A leader's tee reports each step to
its flight (proxy/flight.py), whose followers stream the same file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from politeproxy.cache.base import CacheEvents
from politeproxy.cache.entry import Corrupt, Writer
from politeproxy.cache.store import DiskStore
from politeproxy.policy.cacherules import STORED_HEADERS, Cacheable, CacheLimits, Store, response_decision
from politeproxy.proxy.flight import Flight

T = TypeVar("T")


class Disk(Protocol):
    """What a tee needs of the cache front (cached.CacheFront, which makes the tees and imports this)."""

    @property
    def limits(self) -> CacheLimits: ...
    @property
    def store(self) -> DiskStore: ...
    @property
    def events(self) -> CacheEvents: ...
    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...
    def bg(self, fn: Callable[[], object]) -> None: ...
    def disk_problem(self, e: BaseException) -> None: ...
    async def report_size(self) -> None: ...


class Tee:
    """Fed by relay() with the answer's head and each chunk; writes a storable answer to a temp file."""

    def __init__(self, front: Disk, d: Cacheable, flight: Flight | None = None) -> None:
        self.front, self.d, self.flight = front, d, flight
        self.writer: Writer | None = None
        self.expected = 0
        self.status = 0
        self.headers: list[tuple[str, str]] = []

    def would_store(self, method: str, status: int, headers: Mapping[str, str]) -> bool:
        """Whether this answer's head lets it be kept (its Cache-Status says ``stored``); the disk may still
        refuse it."""
        return isinstance(response_decision(self.front.limits, self.d, method, status, headers), Store)

    async def start(self, method: str, status: int, headers: Mapping[str, str]) -> None:
        if not await self._start(method, status, headers):
            self._fail()  # not storable: the flight's followers go upstream themselves, at once

    async def _start(self, method: str, status: int, headers: Mapping[str, str]) -> bool:
        decision = response_decision(self.front.limits, self.d, method, status, headers)
        if not isinstance(decision, Store):
            return False
        kept = [(h, headers[h]) for h in STORED_HEADERS if h in headers]
        if any(len(v) > 8192 or not v.isprintable() for _h, v in kept):
            return False
        try:
            self.writer = await self.front.run(self.front.store.writer, self.d.key)
        except Exception as e:  # noqa: BLE001 - the answer still goes to the client
            self.front.disk_problem(e)
            return False
        self.expected, self.status, self.headers = decision.length, status, kept
        if self.flight is not None:
            self.flight.started(status, kept, decision.length, self.writer.path)
        return True

    def _fail(self) -> None:
        if self.flight is not None:
            self.flight.end(False)

    async def write(self, chunk: bytes) -> None:
        w = self.writer
        if w is None:
            return
        try:
            await self.front.run(w.write, chunk)
        except Exception as e:  # noqa: BLE001 - a full disk stops the copy, not the answer
            self.front.disk_problem(e)
            self.discard()
            return
        if self.flight is not None:
            self.flight.wrote(w.count)

    async def finish(self, ok: bool) -> bool:
        """Rename into place when ``ok`` and every expected byte came through, else drop the temp file;
        whether it was stored."""
        w, self.writer = self.writer, None
        if w is None:
            return False
        if not ok:
            self.front.bg(w.discard)
            return False
        store = self.front.store
        try:
            evicted = await self.front.run(
                store.commit, w, self.d.key, self.status, self.headers, self.expected
            )
        except Corrupt:
            return False  # short or long: discarded in the commit, as it must be
        except Exception as e:  # noqa: BLE001
            self.front.disk_problem(e)
            self.front.bg(w.discard)
            return False
        if evicted:
            self.front.events.cache_evicted(len(evicted))
        await self.front.report_size()
        return True

    def discard(self) -> None:
        w, self.writer = self.writer, None
        if w is not None:
            self.front.bg(w.discard)
        self._fail()
