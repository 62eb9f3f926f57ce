"""The pacer's queue state, pure: per-host FIFO lines, the next ready host, the max_wait estimate.

No clock reads and no awaits: every time comes in as ``now`` (local monotonic seconds), so this is tested
with a fake clock. A waiter's ``ticket`` is anything with ``done()`` (the pacer uses an asyncio future).

Every table here is bounded by live waiters or by a cap: a line is dropped the moment it empties, and a
host's ready hint (a local copy of what the store said) is dropped once it has passed, or when more than
``HINT_CAP`` hosts hold one (the store still knows; the hint only saves a claim).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

HINT_CAP = 256  # hosts with a local ready hint at most
# A passed hint stays a few seconds, so the backoff gauge's refresh sees the host once more at zero.
HINT_GRACE = 5.0


class Ticket(Protocol):
    def done(self) -> bool: ...


T = TypeVar("T", bound=Ticket)


@dataclass(eq=False)
class Waiter(Generic[T]):
    host: str
    arrived: float
    deadline: float
    ticket: T


class QueueState(Generic[T]):
    def __init__(self, on_depth: Callable[[str, int], None] = lambda _h, _d: None) -> None:
        self.queues: dict[str, deque[Waiter[T]]] = {}
        self.ready: dict[str, float] = {}  # host -> local monotonic time it may be claimed again
        self.total = 0  # waiters in every line
        self.on_depth = on_depth

    # -- lines ----------------------------------------------------------------------------------------

    def depth(self, host: str | None = None) -> int:
        if host is not None:
            return len(self.queues.get(host, ()))
        return self.total

    def add(self, w: Waiter[T]) -> int:
        q = self.queues.setdefault(w.host, deque())
        q.append(w)
        self.total += 1
        self.on_depth(w.host, len(q))
        return len(q)

    def remove(self, w: Waiter[T]) -> bool:
        """Take ``w`` out of its line wherever it stands; False when it was not there."""
        q = self.queues.get(w.host)
        if q is None:
            return False
        try:
            q.remove(w)
        except ValueError:
            return False
        self._shrunk(w.host, q)
        return True

    def push_front(self, w: Waiter[T]) -> None:
        """Put ``w`` back at the head of its line (its reserved slot was not used)."""
        q = self.queues.setdefault(w.host, deque())
        q.appendleft(w)
        self.total += 1
        self.on_depth(w.host, len(q))

    def head(self, host: str) -> Waiter[T] | None:
        q = self.queues.get(host)
        return q[0] if q else None

    def pop_live(self, host: str) -> Waiter[T] | None:
        """Pop the first waiter of ``host`` still waiting (those gone are dropped on the way)."""
        q = self.queues.get(host)
        while q:
            w = q.popleft()
            self._shrunk(host, q)
            if not w.ticket.done():
                return w
        return None

    def _shrunk(self, host: str, q: deque[Waiter[T]]) -> None:
        self.total -= 1
        if not q:
            del self.queues[host]  # an empty line costs nothing: a host's entry lives as long as its line
        self.on_depth(host, len(q))

    def next_ready(self, now: float) -> tuple[str | None, float | None]:
        """The host whose head waited longest among those ready now, and the soonest other ready time."""
        best: Waiter[T] | None = None
        soonest: float | None = None
        for host in list(self.queues):
            q = self.queues[host]
            while q and q[0].ticket.done():  # left already (client gone, timed out)
                q.popleft()
                self._shrunk(host, q)
            if not q:
                continue
            ready = self.ready.get(host, 0.0)
            if ready > now:
                soonest = ready if soonest is None else min(soonest, ready)
                continue
            if best is None or q[0].arrived < best.arrived:
                best = q[0]
        return (best.host if best else None), soonest

    # -- ready hints -------------------------------------------------------------------------------

    def ready_at(self, host: str) -> float:
        return self.ready.get(host, 0.0)

    def set_ready(self, host: str, at: float, now: float) -> None:
        self.ready[host] = at
        if len(self.ready) > HINT_CAP:
            self.prune(now)

    def hold(self, host: str, until: float, now: float) -> None:
        """Push the host's hint out to ``until`` (never pulls it in)."""
        self.set_ready(host, max(self.ready.get(host, 0.0), until), now)

    def prune(self, now: float) -> None:
        """Drop hints that have passed (after a grace), then the soonest ones beyond the cap."""
        for host in [h for h, t in self.ready.items() if t <= now - HINT_GRACE and h not in self.queues]:
            del self.ready[host]
        excess = len(self.ready) - HINT_CAP
        if excess > 0:
            for _t, host in heapq.nsmallest(excess, ((t, h) for h, t in self.ready.items())):
                del self.ready[host]

    def hosts(self) -> set[str]:
        """Hosts this process knows something about now: a line, or a ready hint."""
        return set(self.queues) | set(self.ready)

    # -- the estimate ------------------------------------------------------------------------------

    def estimate(self, host: str, now: float, gap: float, interval: float) -> float:
        """A lower bound on the wait of a request for ``host`` queued now, from what this process sees.

        Only hosts that could go now count as ahead on the global schedule: a line of requests behind a
        host's backoff must not get another, ready host refused for max_wait.
        """
        own = self.depth(host)
        ready_ahead = sum(
            len(q) for h, q in self.queues.items() if h != host and self.ready.get(h, 0.0) <= now
        )
        host_wait = max(0.0, self.ready.get(host, 0.0) - now)
        return max((ready_ahead + own) * gap, host_wait + own * max(gap, interval))
