"""The one async loop that hands out paced slots.

The dispatcher holds at most one reserved slot at a time: it claims, sleeps until the slot, hands it to the
request, and claims again. Several proxies sharing a store therefore interleave on one schedule, and a
request that leaves before its claim spends no slot. Among the lines whose host is ready, the next slot goes
to the pipeline with the least start-time fair-queuing tag (``policy.fairness``), to its longest-waiting
head; a host in backoff is skipped until it is ready, so it never delays another host or pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable

from politeproxy.pacing.base import PacerEvents, PacingSettings, RepeatLog, WaitTooLong, window_full
from politeproxy.pacing.state import QueueState, Waiter
from politeproxy.policy.fairclaim import FairAsk
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.stores.base import Store, StoreError

log = logging.getLogger("politeproxy.pacing.pacer")

ERROR_BACKOFF_FIRST = 0.1  # seconds; doubled on each consecutive error
ERROR_BACKOFF_CAP = 2.0  # a recovered store is used again within this long
PRUNE_EVERY = 1.0  # seconds between sweeps of passed ready hints
SWEEP_EVERY = 0.5  # seconds between looks for waiters that can no longer go within max_wait
TURN_WAIT_MAX = 5.0  # seconds, at most, between asks while other pipelines have the turn


class Dispatcher:
    def __init__(
        self,
        state: QueueState[asyncio.Future[float]],
        store: Store,
        settings: Callable[[], PacingSettings],
        events: PacerEvents,
        monotonic: Callable[[], float],
    ) -> None:
        self.state = state
        self.store = store
        self.settings = settings
        self.events = events
        self.monotonic = monotonic
        self.wake = asyncio.Event()
        self.grants = 0
        self.errors = RepeatLog(log, monotonic)
        self.failures = 0  # consecutive dispatch errors, for the backoff
        self._pruned = 0.0
        self._swept = 0.0
        # host -> until when its request window was last found full: a refusal then names the window
        self._window_full: dict[str, float] = {}
        self.proxy_id = secrets.token_hex(4)  # this proxy's marks in the shared store's fair turns
        self._turn: str | None = None  # the pipeline whose turn the store said it is, served first

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one error
                self.failures += 1
                self.errors.error("pacer dispatcher", e)
                await asyncio.sleep(min(ERROR_BACKOFF_CAP, ERROR_BACKOFF_FIRST * 2 ** (self.failures - 1)))
            else:
                if self.failures:
                    self.failures = 0
                    self.errors.recovered("pacer dispatcher")

    async def once(self) -> None:
        now = self.monotonic()
        if now - self._pruned >= PRUNE_EVERY:
            self._pruned = now
            self.state.prune(now)
        if now - self._swept >= SWEEP_EVERY:
            self._swept = now
            self._refuse_behind(now)
        head, soonest = self.state.next_line(now, self._turn)
        if head is None:
            self.wake.clear()
            timeout = None if soonest is None else max(0.0, soonest - now)
            try:
                async with asyncio.timeout(timeout):
                    await self.wake.wait()
            except TimeoutError:
                pass
            return
        host = head.host
        s = self.settings()
        left = max(0.0, head.deadline - now)
        fair = self._fair_ask(head, now) if s.gap > 0 else None
        w = s.window_for(host)
        c = await self.store.claim(host, s.gap, s.interval_for(host), left, window=w, fair=fair)
        now = self.monotonic()
        if c.outcome is Outcome.GRANTED:
            self._turn = None
            await self._grant(host, head, now + c.wait, c.wait)
        elif c.outcome is Outcome.NOT_YOUR_TURN:
            await self._not_my_turn(c, now)
        elif c.outcome is Outcome.HOST_NOT_READY:
            self.state.set_ready(host, now + c.wait, now)
            if c.window:
                self._window_full[host] = now + c.wait
                if len(self._window_full) > 64:  # a few services' hosts: a fence, not a cache
                    self._window_full.pop(next(iter(self._window_full)))
            self._refuse_hopeless(host, c, now)
        else:
            self._too_late(host, head, c, now)

    async def claim_here(self, host: str, now: float, deadline: float, pipeline: str) -> bool:
        """Global pacing off and nobody ahead for this host: the request claims in its own task, skipping
        the hand-off to this loop. The store still answers, so a host's interval and backoff still hold."""
        try:
            s = self.settings()
            w = s.window_for(host)
            c = await self.store.claim(host, 0.0, s.interval_for(host), deadline - now, window=w)
        except StoreError:
            return False
        if c.granted and c.wait <= 0:
            self.grants += 1
            self.state.charge(pipeline)
            self.events.granted(host, 0.0, pipeline)
            return True
        if c.outcome is Outcome.HOST_NOT_READY:
            self.state.set_ready(host, now + c.wait, now)
        return False

    def _fair_ask(self, head: Waiter[asyncio.Future[float]], now: float) -> FairAsk:
        """The head's pipeline and weight, and every pipeline this proxy has ready: the shared store marks
        them backlogged, so the turns hold whichever proxy a pipeline's requests enter (issue 27)."""
        p = head.pipeline
        return FairAsk(p, self.state.tags.weight(p), self.proxy_id, self.state.ready_pipelines(now))

    async def _not_my_turn(self, c: Claim, now: float) -> None:
        """Another pipeline's turn: serve it next if this proxy has it ready, else ask again after the
        store's wait (bounded here too: a store's answer is not trusted to be sane)."""
        self._turn = c.turn or None
        if c.turn and c.turn in self.state.ready_pipelines(now):
            return
        await asyncio.sleep(min(TURN_WAIT_MAX, max(0.0, c.wait)))

    async def _grant(self, host: str, head: Waiter[asyncio.Future[float]], slot: float, wait: float) -> None:
        self.state.remove(head)
        self.state.under_way = slot  # the estimate counts it (QueueState.lead)
        head.slot = slot  # granted within its max_wait: the waiter waits for it even if this wakes late
        if wait > 0:
            await asyncio.sleep(wait)
            # Event-loop timers may fire up to a millisecond early (uvloop rounds to whole ms against a
            # cached loop time); a grant must never precede its slot.
            while (rest := slot - self.monotonic()) > 0:
                await asyncio.sleep(max(rest, 0.001))
            if await self._throttled_meanwhile(host):
                # A throttle came in while the slot was reserved (answered here or to another proxy on
                # the store): the slot goes unused, a gap, and the request waits out the backoff.
                if not head.ticket.done():
                    self.state.push_front(head)
                return
        if head.ticket.done():
            # The client left while its slot came up: the slot goes to the next of this host's line in the
            # same pipeline, else to the oldest other line of the host.
            head = self.state.pop_live(host, head.pipeline) or head
        self.state.charge(head.pipeline)
        self.grants += 1
        self.events.granted(host, max(0.0, self.monotonic() - slot), head.pipeline)
        if not head.ticket.done():
            head.ticket.set_result(slot)

    async def _throttled_meanwhile(self, host: str) -> bool:
        """Did a backoff for ``host`` start while its slot was reserved? Checks the local hint, then the
        store (one read per slot that had to be waited for; a store that cannot answer changes nothing)."""
        now = self.monotonic()
        if self.state.ready_at(host) > now:
            return True
        try:
            view = await self.store.host_view(host)
        except StoreError:
            return False
        if view.backoff_in > 0:
            self.state.hold(host, now + view.backoff_in, now)
            return True
        return False

    def _too_late(self, host: str, head: Waiter[asyncio.Future[float]], c: Claim, now: float) -> None:
        """The head cannot go before its deadline: refuse it now, with the store's estimate."""
        self.state.remove(head)
        if not head.ticket.done():
            self.events.rejected(host, "max_wait", head.pipeline)
            # Its slot, a moment past its deadline, goes to the next in line: a retry queues behind the
            # others, so Retry-After says when a request let in now would go, never "1 s" after a long hold.
            s = self.settings()
            again = self.state.estimate(host, now, s.gap, s.interval_for(host), head.pipeline)
            late = f"{host} is paced and this request's slot came {c.wait:.1f}s after its max_wait"
            head.ticket.set_exception(WaitTooLong(max(c.wait, again), self._why(host, c, now, late)))
        if c.wait > 0:
            self.state.hold(host, now + min(c.wait, 0.05), now)

    def _why(self, host: str, c: Claim, now: float, text: str = "") -> str:
        """What a refusal says: the window when it is why the request waited, else ``text`` or the wait."""
        full = c.window or now <= self._window_full.get(host, 0.0) + 1.0
        why = window_full(self.settings(), host, c.wait) if full else ""
        return why or text or f"{host} is paced and this request would wait {c.wait:.1f}s"

    def _refuse_hopeless(self, host: str, c: Claim, now: float) -> None:
        """The host cannot go for ``c.wait`` (a backoff, a block, a full window): whoever must go before
        that is told now, with that wait as Retry-After, instead of being held to its deadline (issue 25
        item 7)."""
        for w in self.state.hopeless(host, now + c.wait):
            if not w.ticket.done():
                self.events.rejected(host, "max_wait", w.pipeline)
                w.ticket.set_exception(WaitTooLong(c.wait, self._why(host, c, now)))

    def _refuse_behind(self, now: float) -> None:
        """Whoever arrived behind requests that came later but go first (another pipeline's fair share) and
        can no longer go within max_wait is told now, with its wait as Retry-After (issue 25 item 7)."""
        s = self.settings()
        for w, wait in self.state.behind(now, s.gap, s.interval_for):
            if not w.ticket.done():
                self.events.rejected(w.host, "max_wait", w.pipeline)
                full = now <= self._window_full.get(w.host, 0.0) + 1.0
                why = window_full(s, w.host, wait) if full else ""
                w.ticket.set_exception(
                    WaitTooLong(wait, why or f"{w.host} is paced and this request would wait {wait:.1f}s")
                )

    def refuse_all(self, why: str) -> None:
        """Shutdown: every waiter gets a refusal instead of hanging."""
        for host in list(self.state.by_host):
            while (w := self.state.pop_live(host)) is not None:
                w.ticket.set_exception(WaitTooLong(1.0, why))


async def _settled(ticket: asyncio.Future[float], timeout: float) -> bool:
    """Whether ``ticket`` is done within ``timeout`` seconds. It is never cancelled here (a ticket whose slot
    is reserved must not be, by a timeout nor by the waiting task's cancellation): the wait is on a future
    of its own, woken by the ticket or a timer. One future and one timer a held request, where
    ``asyncio.timeout`` around ``asyncio.shield`` made five objects (issue 44: memory per held request)."""
    if ticket.done():
        return True
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    ticket.add_done_callback(wake)
    timer = loop.call_later(timeout, wake)
    try:
        await woken
    finally:
        timer.cancel()
        ticket.remove_done_callback(wake)
    return ticket.done()


async def wait_for_grant(
    w: Waiter[asyncio.Future[float]], timeout: float, monotonic: Callable[[], float]
) -> bool:
    """Wait for the waiter's grant until ``timeout``; a slot the store granted within max_wait is waited for
    past it (bounded: its slot plus a second), as the dispatcher may wake late (issue 25 item 7: such a
    request was held to max_wait, then refused with Retry-After 1). False when no grant came; the refusal
    the dispatcher set on the ticket is raised."""
    if not await _settled(w.ticket, timeout):
        if w.slot is None or not await _settled(w.ticket, max(0.0, w.slot - monotonic()) + 1.0):
            return False
    w.ticket.result()  # as awaiting it did: the refusal, or CancelledError for a cancelled ticket
    return True
