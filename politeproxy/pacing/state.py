"""The pacer's queue state, pure: per (pipeline, host) FIFO lines, the fair choice of the next line, the
max_wait estimate.

No clock reads and no awaits: every time comes in as ``now`` (local monotonic seconds), so this is tested
with a fake clock. A waiter's ``ticket`` is anything with ``done()`` (the pacer uses an asyncio future).

Every table here is bounded by live waiters or by a cap: a line is dropped the moment it empties, and a
host's ready hint (a local copy of what the store said) is dropped once it has passed, or when more than
``HINT_CAP`` hosts hold one (the store still knows; the hint only saves a claim).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from politeproxy.policy.fairness import DEFAULT_PIPELINE, FairTags

HINT_CAP = 256  # hosts with a local ready hint at most
# A passed hint stays a few seconds, so the backoff gauge's refresh sees the host once more at zero.
HINT_GRACE = 5.0
SWEEP_BUDGET = 20_000  # (waiter, line) pairs one sweep for hopeless waiters may look at (QueueState.behind)


class Ticket(Protocol):
    def done(self) -> bool: ...


T = TypeVar("T", bound=Ticket)


@dataclass(eq=False, slots=True)  # one per held request: no __dict__ (issue 15, memory per held request)
class Waiter(Generic[T]):
    host: str
    arrived: float
    deadline: float
    ticket: T
    pipeline: str = DEFAULT_PIPELINE
    slot: float | None = None  # the slot the dispatcher holds for it (monotonic), once reserved
    again: bool = False  # a client's retry of a refused request: it goes ahead of first tries in its line


Line = tuple[str, str]  # (pipeline, host): one FIFO line


class QueueState(Generic[T]):
    """Per (pipeline, host) FIFO lines; the next slot goes by start-time fair queuing between pipelines
    (``policy.fairness.FairTags``) among the lines whose host could go now."""

    def __init__(self, on_line: Callable[[str, str, int], None] = lambda _h, _p, _d: None) -> None:
        self.queues: dict[Line, deque[Waiter[T]]] = {}
        self.ready: dict[str, float] = {}  # host -> local monotonic time it may be claimed again
        self.total = 0  # waiters in every line
        self.by_host: dict[str, int] = {}  # waiters per host, across pipelines
        self.by_pipeline: dict[str, int] = {}  # waiters per pipeline, across hosts
        self.tags = FairTags()
        self.on_line = on_line
        # The slot the dispatcher holds for a head it took out of its line (monotonic; 0 when none): the
        # estimate counts it, else a request let in at the max_wait boundary came up one slot late, and
        # was held to its deadline and told Retry-After 1 (issue 25 item 7, the outside re-run).
        self.under_way = 0.0

    # -- lines ----------------------------------------------------------------------------------------

    def depth(self, host: str | None = None) -> int:
        if host is not None:
            return self.by_host.get(host, 0)
        return self.total

    def pipeline_depth(self, pipeline: str) -> int:
        return self.by_pipeline.get(pipeline, 0)

    def add(self, w: Waiter[T]) -> int:
        q = self.queues.setdefault((w.pipeline, w.host), deque())
        if w.again:
            q.insert(self.agains(w.pipeline, w.host), w)  # behind earlier retries, ahead of first tries
        else:
            q.append(w)
        self._count(w, 1, len(q))
        return len(q)

    def agains(self, pipeline: str, host: str) -> int:
        """The retries at the head of a line (they stand ahead of its first tries)."""
        n = 0
        for w in self.queues.get((pipeline, host), ()):
            if not w.again:
                break
            n += 1
        return n

    def remove(self, w: Waiter[T]) -> bool:
        """Take ``w`` out of its line wherever it stands; False when it was not there."""
        key = (w.pipeline, w.host)
        q = self.queues.get(key)
        if q is None:
            return False
        try:
            q.remove(w)
        except ValueError:
            return False
        self._shrunk(key, w, q)
        return True

    def push_front(self, w: Waiter[T]) -> None:
        """Put ``w`` back at the head of its line (its reserved slot was not used)."""
        q = self.queues.setdefault((w.pipeline, w.host), deque())
        q.appendleft(w)
        self._count(w, 1, len(q))

    def hopeless(self, host: str, ready: float) -> list[Waiter[T]]:
        """Take out every waiter of ``host`` whose deadline comes before ``ready`` (the host cannot go
        earlier): they are refused now, not held to their deadline."""
        out: list[Waiter[T]] = []
        for key in [k for k in self.queues if k[1] == host]:
            q = self.queues[key]
            for w in [w for w in q if w.deadline < ready]:
                q.remove(w)
                self._shrunk(key, w, q)
                out.append(w)
        return out

    def head(self, host: str) -> Waiter[T] | None:
        """The oldest head among the lines of ``host`` (any pipeline)."""
        heads = [q[0] for (_p, h), q in self.queues.items() if h == host and q]
        return min(heads, key=lambda w: w.arrived) if heads else None

    def pop_live(self, host: str, pipeline: str | None = None) -> Waiter[T] | None:
        """Pop the first waiter of ``host`` still waiting, from ``pipeline``'s line first when given, then
        from the oldest other line of the host (those gone are dropped on the way)."""
        keys = [(pipeline, host)] if pipeline is not None else []
        keys += sorted((k for k in self.queues if k[1] == host), key=lambda k: self.queues[k][0].arrived)
        for key in keys:
            q = self.queues.get(key)
            while q:
                w = q.popleft()
                self._shrunk(key, w, q)
                if not w.ticket.done():
                    return w
        return None

    def _count(self, w: Waiter[T], n: int, line: int) -> None:
        self.total += n
        for table, key in ((self.by_host, w.host), (self.by_pipeline, w.pipeline)):
            v = table.get(key, 0) + n
            if v > 0:
                table[key] = v
            else:
                table.pop(key, None)
        self.on_line(w.host, w.pipeline, line)

    def _shrunk(self, key: Line, w: Waiter[T], q: deque[Waiter[T]]) -> None:
        if not q:
            del self.queues[key]  # an empty line costs nothing: a line lives as long as it has waiters
        self._count(w, -1, len(q))

    def next_line(self, now: float, prefer: str | None = None) -> tuple[Waiter[T] | None, float | None]:
        """The head to serve next, and the soonest time a line not ready now becomes ready.

        Among lines whose host is ready: the pipeline with the least start tag (SFQ), and within it the
        head that waited longest (FIFO per host, oldest first across hosts). ``prefer``: the pipeline
        whose turn the shared store said it is (``policy.fairclaim``), first when it has a ready line."""
        best: Waiter[T] | None = None
        best_tag = 0.0
        soonest: float | None = None
        mine: Waiter[T] | None = None
        for key in list(self.queues):
            q = self.queues[key]
            while q and q[0].ticket.done():  # left already (client gone, timed out)
                self._shrunk(key, q.popleft(), q)
            if not q:
                continue
            ready = self.ready.get(key[1], 0.0)
            if ready > now:
                soonest = ready if soonest is None else min(soonest, ready)
                continue
            if key[0] == prefer and (mine is None or q[0].arrived < mine.arrived):
                mine = q[0]
            tag = self.tags.start(key[0])
            if best is None or (tag, q[0].arrived) < (best_tag, best.arrived):
                best, best_tag = q[0], tag
        return mine or best, soonest

    def ready_pipelines(self, now: float, limit: int = 32) -> tuple[str, ...]:
        """The pipelines with a line whose host could go now (this proxy's backlog, for the shared
        store's fair turns), at most ``limit``."""
        out: dict[str, None] = {}
        for (pipeline, host), q in self.queues.items():
            if q and pipeline not in out and self.ready.get(host, 0.0) <= now:
                out[pipeline] = None
                if len(out) >= limit:
                    break
        return tuple(out)

    def next_ready(self, now: float) -> tuple[str | None, float | None]:
        """The host of the next head to serve (see ``next_line``), and the soonest other ready time."""
        w, soonest = self.next_line(now)
        return (w.host if w else None), soonest

    def charge(self, pipeline: str) -> None:
        """``pipeline`` got a slot: advance its fair-queuing tag."""
        self.tags.charge(pipeline)

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
        for host in [h for h, t in self.ready.items() if t <= now - HINT_GRACE and h not in self.by_host]:
            del self.ready[host]
        excess = len(self.ready) - HINT_CAP
        if excess > 0:
            for _t, host in heapq.nsmallest(excess, ((t, h) for h, t in self.ready.items())):
                del self.ready[host]

    def hosts(self) -> set[str]:
        """Hosts this process knows something about now: a line, or a ready hint."""
        return set(self.by_host) | set(self.ready)

    # -- the estimate ------------------------------------------------------------------------------

    def estimate(
        self,
        host: str,
        now: float,
        gap: float,
        interval: float,
        pipeline: str = DEFAULT_PIPELINE,
        again: bool = False,
    ) -> float:
        """A lower bound on the wait of a request of ``pipeline`` for ``host`` queued now (``estimate``);
        ``again``: a retry, queued behind the line's retries only."""
        # Nobody waits in this process (the usual case when pacing is off): only the host's own wait counts.
        lead = self.lead(now, gap)
        if not self.queues:
            return max(lead, self.ready.get(host, 0.0) - now)
        lines = ((key, len(q)) for key, q in self.queues.items())
        ahead = self.agains(pipeline, host) if again else None
        return estimate(lines, self.ready, now, self.tags, host, gap, interval, pipeline, ahead, lead)

    def lead(self, now: float, gap: float) -> float:
        """Seconds before the first slot free for the lines: after the one under way, a gap later."""
        return self.under_way - now + gap if gap > 0 and self.under_way > now else 0.0

    def behind(
        self,
        now: float,
        gap: float,
        interval_for: Callable[[str], float],
        budget: int = SWEEP_BUDGET,
    ) -> list[tuple[Waiter[T], float]]:
        """Take out every waiter whose own place in the lines puts its slot past its deadline, with that
        wait. The place is a lower bound: its own line ahead of it, the other
        pipelines' waiters with earlier fair tags, the slot under way. Waiters that came later but go first
        (another pipeline's fair share) made it hopeless: it is told now, not at its deadline. ``budget``
        bounds one sweep's work (waiters times lines); the rest wait for the next sweep or their deadline."""
        out: list[tuple[Waiter[T], float]] = []
        lead = self.lead(now, gap)
        counts = [(key, len(q)) for key, q in self.queues.items()]
        for key in list(self.queues):
            q = self.queues[key]
            pipeline, host = key
            interval = interval_for(host)
            ahead = 0
            for w in list(q):
                budget -= len(counts)
                if budget < 0:
                    return self._taken(out)
                wait = estimate(
                    counts, self.ready, now, self.tags, host, gap, interval, pipeline, ahead, lead
                )
                if now + wait > w.deadline and not w.ticket.done():
                    out.append((w, wait))
                else:
                    ahead += 1
        return self._taken(out)

    def _taken(self, out: list[tuple[Waiter[T], float]]) -> list[tuple[Waiter[T], float]]:
        for w, _wait in out:
            self.remove(w)
        return out


def estimate(
    lines: Iterable[tuple[Line, int]],
    ready: Mapping[str, float],
    now: float,
    tags: FairTags,
    host: str,
    gap: float,
    interval: float,
    pipeline: str,
    own_ahead: int | None = None,
    lead: float = 0.0,
) -> float:
    """A lower bound on the wait of a request of ``pipeline`` for ``host`` queued now, from what this
    process sees: its fair position, not the length of every line. Pure: the pacer asks it of its live
    lines, a ``PacerSnapshot`` of its copies (``ready`` then holds seconds left and ``now`` is 0).

    Only lines that could go now count as ahead on the global schedule (a line behind a host's backoff
    must not get another, ready host refused for max_wait). Of another pipeline's ready waiters, only
    those whose fair-queuing start tag comes first count (``FairTags.ahead``); of its own pipeline, all.
    ``own_ahead``: for a request already waiting, the waiters of its own line before it (instead of all of
    its pipeline's); ``lead``: seconds before the first slot free for the lines (``QueueState.lead``).
    """
    ready_by_pipe: dict[str, int] = {}
    host_by_pipe: dict[str, int] = {}
    for (p, h), n in lines:
        if ready.get(h, 0.0) <= now or h == host:
            ready_by_pipe[p] = ready_by_pipe.get(p, 0) + n
        if h == host:
            host_by_pipe[p] = host_by_pipe.get(p, 0) + n
    own = ready_by_pipe.get(pipeline, 0) if own_ahead is None else own_ahead
    ahead = tags.ahead(pipeline, own, ready_by_pipe)
    own_host = host_by_pipe.get(pipeline, 0) if own_ahead is None else own_ahead
    host_ahead = own_host + sum(min(n, host_by_pipe.get(q, 0)) for q, n in ahead.items())
    host_wait = max(0.0, ready.get(host, 0.0) - now)
    global_wait = lead + (own + sum(ahead.values())) * gap
    return max(global_wait, host_wait + host_ahead * max(gap, interval))


SUCCESS_RECHECK = 1.0  # seconds between store resets of a host's throttle count on success


class SuccessChecks:
    """When each host's throttle count in the store was last reset (or found clean) by a success here; a
    host missing is checked on its next success, so dropping an entry only costs a store write. Bounded at
    ``cap`` hosts: the stale ones go first, else the oldest."""

    def __init__(self, cap: int = HINT_CAP) -> None:
        self.cap = cap
        self._checked: dict[str, float] = {}

    def due(self, host: str, now: float) -> bool:
        """Must this success reach the store: not checked here within SUCCESS_RECHECK?"""
        last = self._checked.get(host)
        return last is None or now - last >= SUCCESS_RECHECK

    def mark(self, host: str, now: float) -> None:
        self._checked.pop(host, None)  # re-inserted last: the dict's order is the order of checks
        self._checked[host] = now
        if len(self._checked) > self.cap:
            stale = [h for h, t in self._checked.items() if now - t >= SUCCESS_RECHECK]
            for h in stale or [next(iter(self._checked))]:
                del self._checked[h]

    def forget(self, host: str) -> None:
        """The next success of ``host`` must reach the store (a throttle came, or the last write failed)."""
        self._checked.pop(host, None)
