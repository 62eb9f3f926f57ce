"""Exempt places: a small per-service semaphore whose size may change at any time (a config reload).

Places are kept per service (``policy.services.service_key``: every name of the bucket shares one
``max_in_flight``, issue 24), under the service's own host name. A service's entry lives only while it
has a holder or a waiter, so names a client makes up cost nothing once
their reads end. Places are shared fairly between pipelines: a freed place goes to the waiting pipeline that
holds the fewest of the host's places per weight (``policy.fairness.least_served``), and within a pipeline
first come, first served. A long scan in one pipeline therefore keeps another's reads waiting for one place
to free, not for all of its own queued reads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from politeproxy.policy.fairness import DEFAULT_PIPELINE, least_served
from politeproxy.policy.services import service_key


@dataclass
class _Host:
    held: int = 0
    by_pipeline: dict[str, int] = field(default_factory=dict)  # places held per pipeline
    # pipeline -> its waiters, oldest first; the dict's order is the order pipelines started waiting
    waiters: dict[str, deque[asyncio.Future[None]]] = field(default_factory=dict)

    def waiting(self) -> int:
        return sum(len(q) for q in self.waiters.values())


class ExemptPlaces:
    def __init__(
        self,
        limit: Callable[[], int],
        on_change: Callable[[str, int], None] = lambda _h, _n: None,
        weights: Callable[[], Mapping[str, float]] = dict,
        key: Callable[[str], str] = service_key,
    ) -> None:
        self._key = key  # host -> the name its places are kept under
        self._limit = limit
        self._on_change = on_change
        self._weights = weights
        self._hosts: dict[str, _Host] = {}
        self.waiting = 0  # waiters across every host, for the proxy's queue bound
        self.waiting_by_pipeline: dict[str, int] = {}  # for each pipeline's max_queued

    def in_flight(self, host: str) -> int:
        h = self._hosts.get(self._key(host))
        return h.held if h else 0

    def held_by(self, host: str, pipeline: str) -> int:
        h = self._hosts.get(self._key(host))
        return h.by_pipeline.get(pipeline, 0) if h else 0

    def snapshot(self) -> dict[str, int]:
        return {host: h.held for host, h in self._hosts.items()}

    def hosts(self) -> set[str]:
        return set(self._hosts)

    async def acquire(self, host: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        """Wait for one of the places of ``host``'s service (bound it with a timeout); release() gives it
        back."""
        host = self._key(host)
        h = self._hosts.setdefault(host, _Host())
        if not h.waiters and h.held < self._limit():
            self._take(host, h, pipeline)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        h.waiters.setdefault(pipeline, deque()).append(fut)
        self._count_waiting(pipeline, 1)
        try:
            await fut
        except BaseException:
            if self._drop_waiter(h, pipeline, fut):
                self._count_waiting(pipeline, -1)
            if fut.done() and not fut.cancelled():
                self.release(host, pipeline)  # the place was handed over just as this waiter left: pass it on
            else:
                self._wake(host)
            raise

    def release(self, host: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        host = self._key(host)
        h = self._hosts.get(host)
        if h is None or h.held <= 0:
            return
        h.held -= 1
        n = h.by_pipeline.get(pipeline, 0) - 1
        if n > 0:
            h.by_pipeline[pipeline] = n
        else:
            h.by_pipeline.pop(pipeline, None)
        self._on_change(host, h.held)
        self._wake(host)

    def resize(self) -> None:
        """Let waiters in after the limit grew."""
        for host in list(self._hosts):
            self._wake(host)

    def _take(self, host: str, h: _Host, pipeline: str) -> None:
        h.held += 1
        h.by_pipeline[pipeline] = h.by_pipeline.get(pipeline, 0) + 1
        self._on_change(host, h.held)

    def _count_waiting(self, pipeline: str, n: int) -> None:
        self.waiting += n
        v = self.waiting_by_pipeline.get(pipeline, 0) + n
        if v > 0:
            self.waiting_by_pipeline[pipeline] = v
        else:
            self.waiting_by_pipeline.pop(pipeline, None)

    @staticmethod
    def _drop_waiter(h: _Host, pipeline: str, fut: asyncio.Future[None]) -> bool:
        q = h.waiters.get(pipeline)
        if q is None or fut not in q:
            return False
        q.remove(fut)
        if not q:
            del h.waiters[pipeline]
        return True

    def _wake(self, host: str) -> None:
        h = self._hosts.get(host)
        if h is None:
            return
        while h.waiters and h.held < self._limit():
            pipeline = least_served(h.by_pipeline, list(h.waiters), self._weights())
            if pipeline is None:
                break
            q = h.waiters[pipeline]
            fut = q.popleft()
            if not q:
                del h.waiters[pipeline]
            self._count_waiting(pipeline, -1)
            if not fut.done():
                fut.set_result(None)
                self._take(host, h, pipeline)
        if h.held == 0 and not h.waiters:
            del self._hosts[host]
