"""The event loop of ``politeproxy simulate``: one proxy's pacing on a virtual clock (issue 24 item 6).

A discrete-event simulation of one proxy, with the proxy's own decisions: the store's claim (a
``MemoryStore`` on the simulation's clock: the slots, exempt ceiling and request window of ``policy.slots``
and ``policy.window``), the dispatcher's fair queue (``pacing.state.QueueState``) and its ``PacingSettings``.
A paced request is refused at once when the pacer's estimate is past ``max_wait``, else it queues; the
dispatcher claims for the fairest head, holds the slot, sends it there and claims again
(``Dispatcher.once``). An exempt read claims its GCRA slot and the window itself and asks again after the
wait a refusal names (``pacing.rest.exempt_slot``). tests/unit/commands/test_simulate_vs_pacer.py checks
it sends what ``Pacer.permit`` sends. Not modelled: upstream answers, answer times (so
``exempt.max_in_flight`` never fills), other proxies on the store.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from politeproxy.pacing.base import PacingSettings
from politeproxy.pacing.dispatcher import SWEEP_EVERY
from politeproxy.pacing.state import QueueState, Waiter
from politeproxy.policy.fairness import FAIR_NAMES, PipelineNames, least_served
from politeproxy.policy.services import service_key
from politeproxy.policy.simulation import EXEMPT, Arrival, SimCounts
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.stores.memory import MemoryStore

T0 = 1_000_000.0  # the virtual clock's start: far from 0, which the store's records read as "never"
TIMEOUT_SLACK = 0.05  # the pacer's own timeout on a paced wait: max_wait plus this (pacer._wait_paced)
HOLD_TOO_LATE = 0.05  # the dispatcher holds a host this long after a refusal (Dispatcher._too_late)
MIN_STEP = 1e-3  # an exempt read asks again no sooner than this (a claim naming no wait must not spin)

R = TypeVar("R")


def run_now(coro: Coroutine[Any, Any, R]) -> R:
    """The value of a store coroutine that never suspends (MemoryStore awaits nothing): stepped once."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a store call suspended: the simulation runs only the in-memory store")


@dataclass(slots=True)
class SimTicket:
    """A paced request's ticket in the queue state (anything with ``done()``)."""

    arrival: Arrival
    finished: bool = False

    def done(self) -> bool:
        return self.finished


class Simulation:
    """One proxy, one memory store, one virtual clock: ``run(arrivals)`` then read the tallies."""

    def __init__(self, settings: PacingSettings, shortcut: bool = True) -> None:
        self.s = settings
        # A refused exempt claim writes nothing, and the earliest time it names (Claim.at) can only move
        # later while nothing is written: until the service's records change, a read whose deadline falls
        # before that time is refused without asking again. Most reads of an overloaded workload are such
        # (a 50/s scan against a 10/s ceiling); ``shortcut=False`` asks the store every time (the tests
        # check both give the same report).
        self.shortcut = shortcut
        self.written: dict[str, int] = {}  # service -> grants made in it (each writes its records)
        self.refused_at: dict[str, tuple[int, float]] = {}  # host -> (written, at) of its last refusal
        # Reads that wait for a full window all ask again at the same instant (the window names one time to
        # every one of them): a claim the window refused answers the others asking at that instant, until
        # a grant changes the records.
        self.window_full: dict[str, tuple[float, int, Claim]] = {}
        self.now = T0
        self.store = MemoryStore(clock=lambda: self.now, rand=lambda: 0.5)
        self.state: QueueState[SimTicket] = QueueState()
        self.state.tags.weights = {r.name: r.weight for r in settings.pipelines}
        self.max_queued = {r.name: r.max_queued for r in settings.pipelines if r.max_queued}
        # the names the pacer counts: its fair-share places (idle expiry does not arise in one run's names)
        self.names = PipelineNames((r.name for r in settings.pipelines), free=FAIR_NAMES)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.dispatch_gen = 0  # a dispatcher event of an older generation is stale
        self.dispatch_busy = False  # asleep until a granted slot: a new waiter does not wake it
        self.reserved: Waiter[SimTicket] | None = None  # the head whose slot the dispatcher holds
        self.services: dict[str, SimCounts] = {}
        self.by_host: dict[str, SimCounts] = {}  # host -> its service's tally
        self.pipelines: dict[str, SimCounts] = {}
        self.end = T0
        self.pruned = T0
        self.swept = T0
        self.calls = 0  # store calls made (with Redis, each is a round trip)
        # Exempt places (pacing.exempt.ExemptPlaces): a read holds one of its service's places from before
        # its slot until it is sent; beyond exempt.max_in_flight it waits for one (pacer._exempt_enter).
        self.held: dict[str, dict[str, int]] = {}  # service -> pipeline -> places held
        # service -> pipeline -> [arrival, deadline, still waiting]
        self.place_line: dict[str, dict[str, deque[list[Any]]]] = {}
        self.place_waiting = 0
        self.starting: deque[tuple[Arrival, float]] | None = None  # reads handed a place, started in order
        self.weights = {r.name: r.weight for r in settings.pipelines}

    # -- the event loop ---------------------------------------------------------------------------

    def _ask(self, coro: Coroutine[Any, Any, Claim]) -> Claim:
        self.calls += 1
        return run_now(coro)

    def _at(self, t: float, kind: str, what: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def run(self, requests: Iterable[Arrival]) -> None:
        feed = iter(requests)
        nxt = next(feed, None)
        while nxt is not None or self.events:
            if nxt is not None and (not self.events or T0 + nxt.t <= self.events[0][0]):
                self.now = max(self.now, T0 + nxt.t)
                self._arrive(nxt)
                nxt = next(feed, None)
                continue
            t, _seq, kind, what = heapq.heappop(self.events)
            self.now = max(self.now, t)
            if kind == "dispatch":
                if what == self.dispatch_gen:
                    self._dispatch()
            elif kind == "exempt":
                self._exempt(*what)
            elif kind == "release":
                self._release(*what)
            elif kind == "place_timeout":
                self._place_timeout(what)
            elif kind == "timeout":
                self._timeout(what)
            elif kind == "arrive":  # a request made by the simulation itself (simjob.py: a job's next one)
                self._arrive(what)

    def _arrive(self, a: Arrival) -> None:
        if (name := self.names.counted_as(a.pipeline)) != a.pipeline:  # beyond the proxy's bound: "other"
            a = replace(a, pipeline=name)
        self._tally(a).offered += 1
        if (p := self.pipelines.get(a.pipeline)) is None:
            p = self.pipelines[a.pipeline] = SimCounts()
        p.offered += 1
        if a.klass == EXEMPT:
            self._enter(a, self.now + self.s.max_wait)
        else:
            self._paced(a)

    def _tally(self, a: Arrival) -> SimCounts:
        """The tally of the request's service (asked several times per request: kept per host name)."""
        t = self.by_host.get(a.host)
        if t is None:
            t = self.by_host[a.host] = self.services.setdefault(service_key(a.host), SimCounts())
        return t

    def _wrote(self, host: str) -> None:
        """A granted claim: the records of ``host``'s service changed (see ``_exempt``)."""
        service = service_key(host)
        self.written[service] = self.written.get(service, 0) + 1

    def _sent(self, a: Arrival, at: float) -> None:
        wait = at - (T0 + a.t)
        service = self._tally(a)
        for t in (service, self.pipelines[a.pipeline]):
            t.waits += wait
            t.max_wait = max(t.max_wait, wait)
        service.sends.append(at)
        self.end = max(self.end, at)

    def _refused(self, a: Arrival) -> None:
        self._tally(a).refused += 1
        self.pipelines[a.pipeline].refused += 1
        self.end = max(self.end, self.now)

    # -- exempt places (pacing.exempt.ExemptPlaces, in pacer._exempt_enter's order: the place first) ----

    def _enter(self, a: Arrival, deadline: float) -> None:
        svc = service_key(a.host)
        held = self.held.setdefault(svc, {})
        line = self.place_line.setdefault(svc, {})
        if not line and sum(held.values()) < self.s.exempt_max_in_flight:
            held[a.pipeline] = held.get(a.pipeline, 0) + 1
            self._exempt(a, deadline)
            return
        if sum(held.values()) >= self.s.exempt_max_in_flight:  # pacer._refuse_if_full
            if self.state.total + self.place_waiting >= self.s.max_queue:
                self._refused(a)
                return
        entry: list[Any] = [a, deadline, True]
        line.setdefault(a.pipeline, deque()).append(entry)
        self.place_waiting += 1
        self._at(max(self.now, deadline), "place_timeout", entry)

    def _release(self, a: Arrival) -> None:
        svc = service_key(a.host)
        held = self.held.setdefault(svc, {})
        n = held.get(a.pipeline, 0) - 1
        if n > 0:
            held[a.pipeline] = n
        else:
            held.pop(a.pipeline, None)
        line = self.place_line.get(svc, {})
        while line and sum(held.values()) < self.s.exempt_max_in_flight:
            p = least_served(held, list(line), self.weights)
            if p is None:
                break
            entry = line[p].popleft()
            if not line[p]:
                del line[p]
            self.place_waiting -= 1
            entry[2] = False
            held[p] = held.get(p, 0) + 1
            self._start(entry[0], entry[1])

    def _start(self, a: Arrival, deadline: float) -> None:
        """A read handed a place goes on to its slot; one refused at once hands its place on, so the
        starts run as a loop here, not a recursion."""
        if self.starting is not None:
            self.starting.append((a, deadline))
            return
        self.starting = deque([(a, deadline)])
        try:
            while self.starting:
                self._exempt(*self.starting.popleft())
        finally:
            self.starting = None

    def _place_timeout(self, entry: list[Any]) -> None:
        if not entry[2]:
            return
        entry[2] = False
        a = entry[0]
        line = self.place_line.get(service_key(a.host), {})
        q = line.get(a.pipeline)
        if q is not None and entry in q:
            q.remove(entry)
            if not q:
                del line[a.pipeline]
            self.place_waiting -= 1
        self._refused(a)

    # -- exempt reads (pacing.rest.exempt_slot) ---------------------------------------------------

    def _exempt(self, a: Arrival, deadline: float) -> None:
        s, host = self.s, a.host
        window = s.window_for(host)
        hold = s.exempt_respect_backoff
        if not hold and s.exempt_rate <= 0 and window is None:
            self._sent(a, self.now)
            self._release(a)
            return
        service = service_key(host)
        written = self.written.get(service, 0)
        if self.shortcut and (memo := self.refused_at.get(host)) is not None:
            if memo[0] == written and deadline < memo[1]:
                self._refused(a)  # nothing of the service written since a claim found `at` the earliest
                self._release(a)
                return
        herd = self.window_full.get(host) if self.shortcut else None
        if herd is not None and herd[:2] == (self.now, written):
            # What this instant's first claim got from the same records: the window's time, which the store
            # would call too late or not by this read's own deadline.
            at, wait = herd[2].at, herd[2].wait
            c = Claim(Outcome.TOO_LATE if at > deadline else Outcome.HOST_NOT_READY, wait, at, window=True)
        else:
            left = max(0.0, deadline - self.now)
            c = self._ask(
                self.store.exempt_claim(host, s.exempt_rate, s.exempt_burst, left, hold, service, window)
            )
            if c.window:
                self.window_full[host] = (self.now, written, c)
        if c.outcome is Outcome.TOO_LATE or (c.wait > 0 and self.now + c.wait > deadline):
            self.refused_at[host] = (written, c.at)
            self._refused(a)
            self._release(a)
        elif c.granted:
            self._wrote(host)
            self._sent(a, self.now + max(0.0, c.wait))
            self._at(self.now + max(0.0, c.wait), "release", (a,))  # the permit ends when it is sent
        else:
            self._at(self.now + max(c.wait, MIN_STEP), "exempt", (a, deadline))

    # -- paced requests (pacer._wait_paced and the dispatcher) ------------------------------------

    def _paced(self, a: Arrival) -> None:
        s, host, now = self.s, a.host, self.now
        deadline = now + s.max_wait
        interval = s.interval_for(host)
        if now + self.state.estimate(host, now, s.gap, interval, a.pipeline) > deadline:
            self._refused(a)
            return
        if s.gap <= 0 and not self.state.depth(host) and self.state.ready_at(host) <= now:
            c = self._ask(self.store.claim(host, 0.0, interval, deadline - now, window=s.window_for(host)))
            if c.granted:
                self._wrote(host)
            if c.granted and c.wait <= 0:
                self.state.charge(a.pipeline)
                self._sent(a, now)
                return
            if c.outcome is Outcome.HOST_NOT_READY:
                self.state.set_ready(host, now + c.wait, now)
        cap = self.max_queued.get(a.pipeline)
        if self.state.total >= s.max_queue or (
            cap is not None and self.state.pipeline_depth(a.pipeline) >= cap
        ):
            self._refused(a)
            return
        w = Waiter(host, now, deadline, SimTicket(a), a.pipeline)
        self.state.add(w)
        self._at(deadline + TIMEOUT_SLACK, "timeout", w)
        if not self.dispatch_busy:  # the pacer sets the dispatcher's wake event
            self._wake(now)

    def _timeout(self, w: Waiter[SimTicket]) -> None:
        if not w.ticket.finished:
            w.ticket.finished = True
            self.state.remove(w)
            self._refused(w.ticket.arrival)

    def _wake(self, at: float) -> None:
        self.dispatch_gen += 1
        self._at(at, "dispatch", self.dispatch_gen)

    def _dispatch(self) -> None:
        """One turn of ``Dispatcher.once``; the next turn is scheduled as its sleeps would end."""
        self.dispatch_busy = False
        if self.reserved is not None:  # the slot has come: the request goes (Dispatcher._grant's end)
            self._granted(self.reserved)
        now, s = self.now, self.s
        if now - self.pruned >= 1.0:
            self.pruned = now
            self.state.prune(now)
        if now - self.swept >= SWEEP_EVERY:  # Dispatcher._refuse_behind
            self.swept = now
            for w, _wait in self.state.behind(now, s.gap, s.interval_for):
                if not w.ticket.finished:
                    w.ticket.finished = True
                    self._refused(w.ticket.arrival)
        head, soonest = self.state.next_line(now)
        if head is None:
            if soonest is not None:  # asleep on the wake event, with a timeout at the soonest ready line
                self._wake(soonest)
            return
        host = head.host
        left = max(0.0, head.deadline - now)
        c = self._ask(self.store.claim(host, s.gap, s.interval_for(host), left, window=s.window_for(host)))
        if c.outcome is Outcome.GRANTED:
            self._grant(head, c)
            return
        if c.outcome is Outcome.HOST_NOT_READY:
            self.state.set_ready(host, now + c.wait, now)
            for w in self.state.hopeless(host, now + c.wait):  # Dispatcher._refuse_hopeless
                if not w.ticket.finished:
                    w.ticket.finished = True
                    self._refused(w.ticket.arrival)
        else:
            self._too_late(head, c)
        self._wake(now)

    def _grant(self, head: Waiter[SimTicket], c: Claim) -> None:
        """The head's slot is reserved: out of its line now, charged to its pipeline and sent at the slot
        (the dispatcher sleeps until then, holding it)."""
        self.state.remove(head)
        self._wrote(head.host)
        self.reserved = head
        self.state.under_way = self.now + max(0.0, c.wait)
        if c.wait > 0:
            self.dispatch_busy = True
            self._wake(self.now + c.wait)
        else:
            self._granted(head)
            self._wake(self.now)

    def _granted(self, head: Waiter[SimTicket]) -> None:
        self.reserved = None
        self.state.charge(head.pipeline)
        head.ticket.finished = True
        self._sent(head.ticket.arrival, self.now)

    def _too_late(self, head: Waiter[SimTicket], c: Claim) -> None:
        self.state.remove(head)
        if not head.ticket.finished:
            head.ticket.finished = True
            self._refused(head.ticket.arrival)
        if c.wait > 0:
            self.state.hold(head.host, self.now + min(c.wait, HOLD_TOO_LATE), self.now)
