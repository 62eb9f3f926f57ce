"""Per-key single flight for cache misses (issue 25): one upstream fetch per key in this process, and its
followers streaming the leader's body from its temporary file as it arrives.

The leader's tee (``cachetee.Tee``) reports to its ``Flight``: the head it stores, each body byte written,
and the end (stored, or not). A follower waits, without any lock or thread, for the head; then answers its
client with the stored headers and the bytes on disk so far, and more as they come. It ends its answer only
when the leader's copy was stored whole (a leader that failed, cut or ran long cuts its followers too,
never a short or wrong body). A follower that cannot follow (no head within its wait, the answer not
storable, the file gone) returns None: the caller looks the key up again or fetches on its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from multidict import CIMultiDict

from politeproxy.cache.store import LEASE_REFRESH, DiskStore
from politeproxy.proxy.common.clientside import ClientSide
from politeproxy.proxy.common.exchange import Exchange
from politeproxy.proxy.common.passage import stamp
from politeproxy.proxy.forwarding.speak import standard_fields

log = logging.getLogger("politeproxy")
T = TypeVar("T")
LEASE_POLL = 0.05  # seconds between looks at a lease another process holds (on the loop, a sleep between)
FOLLOW_CHUNK = 1 << 20  # bytes a follower reads per thread hop (as a hit)
FOLLOW_STALL = 120.0  # seconds without progress after which a follower gives up (the leader's own read
# timeout ends a stalled download long before: this only bounds a follower whatever happens)


class DiskRunner(Protocol):
    """What a flight needs of the cache front: file work off the loop, or in the background."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...
    def bg(self, fn: Callable[[], object]) -> None: ...


class Leasing(DiskRunner, Protocol):
    """What taking a key's lease between processes needs of the cache front (cached.CacheFront)."""

    @property
    def store(self) -> DiskStore: ...
    def disk_problem(self, e: BaseException) -> None: ...


class Flight:
    """One key's fetch in this process. ``outcome``: None while it runs, True once stored, False when it
    will not be (failed, cut, not storable)."""

    def __init__(self, key: str, name: str, head_within: float) -> None:
        self.key, self.name = key, name
        loop = asyncio.get_running_loop()
        self.head_by = loop.time() + head_within  # followers without a head by then go on their own
        self.followers = 0
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.expected = 0
        self.part: Path | None = None  # the temporary file the body goes to, once the head is stored
        self.written = 0
        self.outcome: bool | None = None
        self.leased = False  # holds the key's lease between processes (cached.CacheFront drops it)
        self.refresher: asyncio.Task[None] | None = None
        self.change: asyncio.Future[None] = loop.create_future()

    def fetching(self, head_within: float) -> None:
        """The leader goes upstream now (after its wait for another proxy's lease): its followers' wait
        for the head starts again, so they do not all go upstream the moment that first wait ends."""
        self.head_by = asyncio.get_running_loop().time() + head_within
        self._wake()

    def started(self, status: int, headers: list[tuple[str, str]], expected: int, part: Path) -> None:
        self.status, self.headers, self.expected, self.part = status, headers, expected, part
        self._wake()

    def wrote(self, count: int) -> None:
        self.written = count
        self._wake()

    def end(self, stored: bool) -> None:
        if self.outcome is None:
            self.outcome = stored
            self._wake()

    def _wake(self) -> None:
        done, self.change = self.change, asyncio.get_running_loop().create_future()
        done.set_result(None)


async def _changed(fut: asyncio.Future[None], timeout: float) -> bool:
    """Whether ``fut`` (a flight's ``change`` read before looking at its state) came within ``timeout``."""
    if timeout <= 0:
        return fut.done()
    try:
        await asyncio.wait_for(asyncio.shield(fut), timeout)
    except TimeoutError:
        return False
    return True


async def _head(flight: Flight) -> bool:
    """Wait until the flight's ``head_by`` for the leader's head or its end; whether there is a body to
    follow."""
    loop = asyncio.get_running_loop()
    while flight.part is None and flight.outcome is None:
        if not await _changed(flight.change, flight.head_by - loop.time()):
            return False
    return flight.part is not None and flight.outcome is not False


async def follow(
    disk: DiskRunner,
    client: ClientSide,
    flight: Flight,
    ex: Exchange,
    served: Callable[[], None],
) -> bool:
    """Answer ``client`` with the leader's answer as it streams to disk; False when it cannot be followed
    (``served`` is called just before an answer starts: the caller counts it as a hit)."""
    if not await _head(flight):
        return False
    assert flight.part is not None
    try:
        f: BinaryIO = await disk.run(_open, flight.part)
    except OSError:  # renamed into place (stored: a hit now) or discarded since
        return False
    served()
    headers: CIMultiDict[str] = CIMultiDict(flight.headers)
    headers["Age"] = "0"
    stamp(headers)
    standard_fields(headers, ex)  # a hit (``served`` recorded it), with the quota read before the cache
    ex.status = flight.status
    client.start(flight.status, None, headers)
    try:
        await _pump(disk, f, flight, ex, client.write)
        await client.end()
    except ConnectionError:
        ex.note = "client_gone"
    except (_Broken, OSError, TimeoutError):
        ex.note = "upstream_broke"  # the leader's answer failed: the client sees a cut, as the leader's did
        client.abort()
    finally:
        disk.bg(f.close)
    return True


class _Broken(Exception):
    """The leader's copy will not be stored, or stopped moving."""


async def _pump(
    disk: DiskRunner, f: BinaryIO, flight: Flight, ex: Exchange, write: Callable[[bytes], Awaitable[None]]
) -> None:
    """Send the leader's body from ``f`` as it is written, until it is stored whole; _Broken otherwise."""
    sent = 0
    while True:
        change = flight.change  # read before the state: a wake in between is not lost
        if sent < flight.written:
            chunk = await disk.run(f.read, min(FOLLOW_CHUNK, flight.written - sent))
            if not chunk:
                raise OSError("the leader's file ended early")
            sent += len(chunk)
            await write(chunk)
            ex.bytes += len(chunk)
            continue
        if flight.outcome is True and sent == flight.expected:
            return
        if flight.outcome is not None:
            raise _Broken("the leader's answer was not stored")
        if not await _changed(change, FOLLOW_STALL):
            raise _Broken(f"no progress for {FOLLOW_STALL:g}s")


def _open(path: Path) -> BinaryIO:
    return open(path, "rb", buffering=0)  # noqa: SIM115 - the follower closes it


async def take_lease(front: Leasing, flight: Flight, max_wait: float) -> None:
    """Take the key's lease between processes, polling one that another proxy holds for at most
    ``max_wait`` (from the loop: a sleep between looks, each look one short call in a thread). Without it
    (the wait ran out, or the directory holds no leases) the leader goes anyway."""
    deadline = time.monotonic() + max_wait
    while True:
        try:
            if await front.run(front.store.take_lease, flight.key):
                flight.leased = True
                flight.refresher = asyncio.get_running_loop().create_task(_refresh(front, flight.key))
                return
        except Exception as e:  # noqa: BLE001 - no lease: single flight in this process only
            front.disk_problem(e)
            return
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(LEASE_POLL)


async def _refresh(front: Leasing, key: str) -> None:
    """Keep a held lease fresh while its download runs, so no other proxy takes it over."""
    while True:
        await asyncio.sleep(LEASE_REFRESH)
        try:
            await front.run(front.store.refresh_lease, key)
        except Exception as e:  # noqa: BLE001 - a lost refresh at worst lets another proxy fetch too
            log.debug("cache lease refresh: %s", e)
