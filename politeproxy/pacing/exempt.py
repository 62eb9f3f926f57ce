"""Exempt places: a small per-host semaphore whose size may change at any time (a config reload).

A host's entry lives only while it has a holder or a waiter, so names a client makes up cost nothing once
their reads end. Waiters are served first come, first served.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Host:
    held: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class ExemptPlaces:
    def __init__(
        self, limit: Callable[[], int], on_change: Callable[[str, int], None] = lambda _h, _n: None
    ) -> None:
        self._limit = limit
        self._on_change = on_change
        self._hosts: dict[str, _Host] = {}
        self.waiting = 0  # waiters across every host, for the proxy's queue bound

    def in_flight(self, host: str) -> int:
        h = self._hosts.get(host)
        return h.held if h else 0

    def snapshot(self) -> dict[str, int]:
        return {host: h.held for host, h in self._hosts.items()}

    def hosts(self) -> set[str]:
        return set(self._hosts)

    async def acquire(self, host: str) -> None:
        """Wait for one of ``host``'s places (bound it with a timeout); release() gives it back."""
        h = self._hosts.setdefault(host, _Host())
        if not h.waiters and h.held < self._limit():
            self._take(host, h)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        h.waiters.append(fut)
        self.waiting += 1
        try:
            await fut
        except BaseException:
            if fut in h.waiters:
                h.waiters.remove(fut)
                self.waiting -= 1
            if fut.done() and not fut.cancelled():
                self.release(host)  # the place was handed over just as this waiter left: pass it on
            else:
                self._wake(host)
            raise

    def release(self, host: str) -> None:
        h = self._hosts.get(host)
        if h is None or h.held <= 0:
            return
        h.held -= 1
        self._on_change(host, h.held)
        self._wake(host)

    def resize(self) -> None:
        """Let waiters in after the limit grew."""
        for host in list(self._hosts):
            self._wake(host)

    def _take(self, host: str, h: _Host) -> None:
        h.held += 1
        self._on_change(host, h.held)

    def _wake(self, host: str) -> None:
        h = self._hosts.get(host)
        if h is None:
            return
        while h.waiters and h.held < self._limit():
            fut = h.waiters.popleft()
            self.waiting -= 1
            if not fut.done():
                fut.set_result(None)
                self._take(host, h)
        if h.held == 0 and not h.waiters:
            del self._hosts[host]
