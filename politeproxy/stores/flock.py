"""The file store's lock: one coroutine of this process at a time, then the flock of ``ratelimit.lock``
(shared with every proxy and ccrawl on the data dir), waited for in a thread when another process holds it."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from politeproxy.stores.base import StoreBusy

T = TypeVar("T")


class LockOwner(Protocol):
    """What ``Held`` needs of the file store (a Protocol, so this module does not import the store's)."""

    _inproc: asyncio.BoundedSemaphore | None
    lock_timeout: float
    path: Path
    fd: int

    async def _lock(self) -> None: ...

    def _lock_nb(self) -> bool: ...

    def _unlock(self) -> None: ...


class Held:
    """``FileStore._held()``'s context: this process's turn (one coroutine at a time), then the flock. A small
    class rather than an @asynccontextmanager: no generator frames per claim, which every request makes."""

    __slots__ = ("_store",)

    def __init__(self, store: LockOwner) -> None:
        self._store = store

    async def __aenter__(self) -> None:
        store = self._store
        if store._inproc is None:
            store._inproc = asyncio.BoundedSemaphore(1)
        inproc = store._inproc
        if inproc.locked():  # only a wait needs a timer: a free lock is taken at once (hot path)
            try:
                async with asyncio.timeout(store.lock_timeout):
                    await inproc.acquire()
            except TimeoutError as e:
                raise StoreBusy(_busy_here(store)) from e
        else:
            await inproc.acquire()
        try:
            await store._lock()
        except BaseException:
            inproc.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        store = self._store
        try:
            store._unlock()
        finally:
            assert store._inproc is not None
            store._inproc.release()


async def run_held(store: LockOwner, fn: Callable[[], T]) -> T:
    """``fn`` (synchronous) under the store's lock. The usual case awaits nothing: no coroutine of this
    process holds or waits for the lock and the flock comes at once, so nothing can run between the lock
    and the unlock (the claim every request makes: no semaphore, no context manager). Else ``Held``."""
    inproc = store._inproc
    if (inproc is None or not inproc.locked()) and store._lock_nb():
        try:
            return fn()
        finally:
            store._unlock()
    async with Held(store):
        return fn()


def locked_by(store: LockOwner, who: str, how: str = "") -> str:
    """The one text for a flock another process held past ``lock_timeout`` (``who``: ``lock_holders``)."""
    return f"{store.path} is locked by {who}{how} for over {store.lock_timeout:g} s"


def _busy_here(store: LockOwner) -> str:
    """Why this process's turn did not come: the claim ahead of it is a flock wait (another process holds the
    flock, named from /proc/locks) or, when nobody else holds it, this process is busy with the store."""
    who = lock_holders(store.fd)
    if who.startswith("pid "):
        return locked_by(store, who, "; this process's claims wait for it")
    return f"cannot lock {store.path}: busy in this process"


class LockWait:
    """One wait for the flock in the lock thread. It polls LOCK_NB until its deadline rather than blocking
    in flock(), so the thread never outlives its waiter by more than one poll; and a lock it gets after its
    waiter left is released at once (``abandon``), so nobody is locked out by a thread nobody awaits."""

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        self.mu = threading.Lock()
        self.abandoned = False
        self.acquired = False

    def run(self) -> bool:
        pause = 0.001
        while True:
            with self.mu:  # the waiter's abandon() cannot slip between the check and the flock
                if self.abandoned:
                    return False
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.acquired = True
                    return True
                except BlockingIOError:
                    pass
            if time.monotonic() >= self.deadline:
                return False
            time.sleep(pause)
            pause = min(0.01, pause * 2)

    def abandon(self) -> None:
        with self.mu:
            self.abandoned = True
            if self.acquired:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                self.acquired = False


def lock_holders(fd: int, locks: str = "/proc/locks") -> str:
    """Who holds the flock of ``fd``'s file, for the log: "pid 123 (ccrawl)", from ``/proc/locks`` (Linux);
    "another process" when that cannot be told. Never raises (the file and the names are the system's)."""
    try:
        st = os.fstat(fd)
        with open(locks, encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return "another process"
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids: list[int] = []
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:131 0 EOF"; a waiter's line has "->" after the number
        if len(parts) >= 6 and "->" not in parts[1] and parts[1] == "FLOCK" and parts[5] == inode:
            if parts[4].isdigit() and int(parts[4]) != os.getpid():
                pids.append(int(parts[4]))
    if not pids:
        return "another process"
    return ", ".join(f"pid {p} ({_command(p)})" for p in sorted(set(pids))[:3])


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read(512).split(b"\0")
    except OSError:
        return "?"
    shown = " ".join(a.decode("utf-8", "replace") for a in args[:4] if a)
    return "".join(ch if ch.isprintable() else "?" for ch in shown)[:120] or "?"
