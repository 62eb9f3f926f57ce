"""The tee of a cache miss: relay() feeds it the answer's head and each chunk as they go to the client; it
writes a storable answer to a temporary file, and its commit renames the file into place only when every
announced byte came through (proxy/forwarding/cached.py makes and finishes it). A leader's tee reports each
step to its flight (proxy/forwarding/flight.py), whose followers stream the same file.

A CDX answer (issue 43) may come without a Content-Length (pywb streams it): it is kept when it ended
cleanly within max_object, with the length it had; a 200 only once a byte other than whitespace came
(pywb's empty 200 is a failure, never an answer), and its followers are told of it only then, so an
empty answer sends each of them upstream on its own instead of cutting them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from politeproxy.cache.base import CacheEvents
from politeproxy.cache.entry import Corrupt, Writer
from politeproxy.cache.store import INDEX_KIND, DiskStore
from politeproxy.policy.cacherules import (
    STORED_HEADERS,
    UNKNOWN,
    Cacheable,
    CacheLimits,
    DontKeep,
    Keep,
    keeps_body,
    response_decision,
)
from politeproxy.proxy.forwarding.flight import Flight

T = TypeVar("T")


class TeeFront(Protocol):
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

    def __init__(self, front: TeeFront, d: Cacheable, flight: Flight | None = None) -> None:
        self.front, self.d, self.flight = front, d, flight
        self.writer: Writer | None = None
        self.expected = 0  # UNKNOWN: no Content-Length (a CDX answer)
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.has_text = False  # a byte other than whitespace came (a CDX 200 is kept only then)
        self.announced = False  # the flight was told of the head
        # an index question's turn (cached.CacheFront._turn): forward.py awaits it once the permit is
        # granted, before it asks upstream; True: answered from another proxy's kept answer instead
        self.gate: Callable[[], Awaitable[bool]] | None = None
        # the rules' decision on the answer's head, made once: relay() asks it for Cache-Status, then start()
        self._decided: tuple[tuple[str, int, int], Keep | DontKeep] | None = None

    def _decision(self, method: str, status: int, headers: Mapping[str, str]) -> Keep | DontKeep:
        key = (method, status, id(headers))
        if self._decided is None or self._decided[0] != key:
            self._decided = key, response_decision(self.front.limits, self.d, method, status, headers)
        return self._decided[1]

    def would_store(self, method: str, status: int, headers: Mapping[str, str]) -> bool:
        """Whether this answer's head lets it be kept (its Cache-Status says ``stored``); the disk may still
        refuse it."""
        return isinstance(self._decision(method, status, headers), Keep)

    async def start(self, method: str, status: int, headers: Mapping[str, str]) -> None:
        if not await self._start(method, status, headers):
            self._fail()  # not storable: the flight's followers go upstream themselves, at once

    async def _start(self, method: str, status: int, headers: Mapping[str, str]) -> bool:
        decision = self._decision(method, status, headers)
        if not isinstance(decision, Keep):
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
        self._announce()
        return True

    def _announce(self) -> None:
        """Tell the flight's followers of the head once the body is one worth keeping (so far)."""
        if self.flight is None or self.announced or self.writer is None:
            return
        if keeps_body(self.d, self.status, self.has_text):
            self.announced = True
            self.flight.started(self.status, self.headers, self.expected, self.writer.path)

    def _fail(self) -> None:
        if self.flight is not None:
            self.flight.end(False)

    async def write(self, chunk: bytes) -> None:
        w = self.writer
        if w is None:
            return
        if self.expected == UNKNOWN and w.count + len(chunk) > self.front.limits.max_object:
            self.discard()  # too large to keep: the answer still streams on
            return
        try:
            await self.front.run(w.write, chunk)
        except Exception as e:  # noqa: BLE001 - a full disk stops the copy, not the answer
            self.front.disk_problem(e)
            self.discard()
            return
        if not self.has_text and chunk.strip():
            self.has_text = True
            self._announce()
        if self.flight is not None and self.announced:
            self.flight.wrote(w.count)

    async def finish(self, ok: bool) -> bool:
        """Rename into place when ``ok`` and every expected byte came through, else drop the temp file;
        whether it was stored."""
        w, self.writer = self.writer, None
        if w is None:
            return False
        if not ok or not keeps_body(self.d, self.status, self.has_text):
            self.front.bg(w.discard)
            return False
        store, headers, expected = self.front.store, self.headers, self.expected
        if expected == UNKNOWN:  # a streamed answer: kept with the length it had (the commit checks it)
            expected = w.count
            headers = [*headers, ("Content-Length", str(expected))]
            if self.flight is not None:
                self.flight.expected = expected
        try:
            kind = INDEX_KIND if self.d.rule.cdx else ""
            evicted = await self.front.run(store.commit, w, self.d.key, self.status, headers, expected, kind)
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
