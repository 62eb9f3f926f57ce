"""The pacer facade: one call holds a request until it may go, and takes the upstream's answer back.

The parts: ``state`` (pure per-host lines, ready hints, the estimate), ``dispatcher`` (the one loop that
claims slots from the store), ``exempt`` (per-host places for exempt reads). Every per-host table is
bounded: lines and places vanish when they empty, hints and success checks have caps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from politeproxy.pacing.base import (
    DEFAULT_MAX_QUEUE,
    INDEX_HOST_INTERVAL,
    NoEvents,
    PacerEvents,
    PacingSettings,
    RepeatLog,
    WaitTooLong,
)
from politeproxy.pacing.dispatcher import Dispatcher
from politeproxy.pacing.exempt import ExemptPlaces
from politeproxy.pacing.permit import Permit
from politeproxy.pacing.rest import RestNotes, exempt_slot
from politeproxy.pacing.state import HINT_CAP, QueueState, Waiter
from politeproxy.policy.backoff import Delay, Kind, answer_delay, parse_retry_after
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE, PipelineNames, PipelineRule
from politeproxy.policy.slots import HostState, Outcome
from politeproxy.stores.base import HostView, Store, StoreError

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "INDEX_HOST_INTERVAL",
    "Pacer",
    "PacerEvents",
    "PacingSettings",
    "Permit",
    "WaitTooLong",
]

log = logging.getLogger("politeproxy.pacing.pacer")

SUCCESS_RECHECK = 1.0  # seconds between store resets of a host's throttle count on success
FEEDBACK_CLOSE_TIMEOUT = 5.0  # close() waits this long for feedback still being recorded
MAX_REMEMBERED_NAMES = 1024  # requested pipeline names remembered with the name each counts as


class Pacer:
    """One request budget for every paced host. Use it as aiolimiter's limiters are used::

        async with pacer.permit(host, Klass.PACED) as p:      # waits for a slot, or raises WaitTooLong
            resp = await send(...)
            delay = await p.answered(resp.status, resp.headers.get("Retry-After"))

    ``Klass.EXEMPT`` holds one of the host's exempt places for the block instead of a slot.
    """

    def __init__(
        self,
        store: Store,
        settings: PacingSettings | None = None,
        events: PacerEvents | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings or PacingSettings()
        self.events: PacerEvents = events or NoEvents()
        self.monotonic = monotonic
        self.dispatcher = Dispatcher(QueueState(), store, lambda: self.settings, self.events, monotonic)
        self.report = self.dispatcher.report
        self.state: QueueState[asyncio.Future[float]] = self.dispatcher.state
        if not self.report.pipes:  # a sink that labels pipelines gets every line's depth instead
            self.state.on_depth = self.events.queue_changed
        self.state.on_line = self.report.line_changed
        self.places = ExemptPlaces(
            lambda: self.settings.exempt_max_in_flight, self.events.exempt_changed, lambda: self._weights
        )
        self.pipelines = PipelineNames()
        # Requested name -> the name it counts as, remembered (asked twice per request). Client-chosen
        # keys, so cleared at MAX_REMEMBERED_NAMES, and on configure (a name may become configured).
        self._named: dict[str | None, str] = {}
        self._rules: dict[str, PipelineRule] = {}
        self._weights: dict[str, float] = {}
        self._configure_pipelines(self.settings.pipelines)
        # When each host's throttle count in the store was last reset (or found clean) by a success here;
        # a host missing is checked on its next success, so dropping an entry only costs a store write.
        self._checked: dict[str, float] = {}
        self._errors = RepeatLog(log, monotonic)
        self._task: asyncio.Task[None] | None = None
        self._feedback_tasks: set[asyncio.Task[Delay | None]] = set()
        self.rest = RestNotes(HINT_CAP)  # what rests each host, for the body of our own refusals

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.dispatcher.run())

    async def close(self) -> None:
        """Wait (bounded) for feedback still being recorded, stop the dispatcher, refuse who is left."""
        pending = set(self._feedback_tasks)
        if pending:
            _done, late = await asyncio.wait(pending, timeout=FEEDBACK_CLOSE_TIMEOUT)
            if late:
                log.warning(
                    "%d answers not recorded within %.0fs at shutdown", len(late), FEEDBACK_CLOSE_TIMEOUT
                )
                for t in late:
                    t.cancel()
                await asyncio.wait(late, timeout=1.0)
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.dispatcher.refuse_all("proxy shutting down")

    def update(self, settings: PacingSettings) -> None:
        self.settings = settings
        self._configure_pipelines(settings.pipelines)
        self.dispatcher.wake.set()
        self.places.resize()

    def _configure_pipelines(self, rules: tuple[PipelineRule, ...]) -> None:
        """The configured pipelines keep their names whatever else comes; their weights feed the fair
        queue (paced slots) and the exempt places alike."""
        self._rules = {r.name: r for r in rules}
        self._weights = {r.name: r.weight for r in rules}
        self.pipelines.configure(self._rules)
        self._named.clear()
        self.state.tags.weights = self._weights

    def pipeline(self, name: str | None) -> str:
        """The pipeline a requested name counts as (bounded; ``None`` is the default pipeline)."""
        try:
            return self._named[name]
        except KeyError:
            pass
        # PipelineNames answers a name the same way until configure (its first-come set only grows)
        counted = self.pipelines(name or DEFAULT_PIPELINE)
        if len(self._named) >= MAX_REMEMBERED_NAMES:
            self._named.clear()
        self._named[name] = counted
        return counted

    def depth(self, host: str | None = None) -> int:
        return self.state.depth(host)

    def known_hosts(self) -> set[str]:
        """Hosts worth a backoff-gauge refresh: a line, a ready hint, or exempt reads in flight."""
        return self.state.hosts() | self.places.hosts()

    @property
    def grants(self) -> int:
        return self.dispatcher.grants

    # Read-only views of the internals, kept for callers written against the old attributes.
    @property
    def queues(self) -> dict[str, int]:
        return dict(self.state.by_host)

    @property
    def host_ready(self) -> dict[str, float]:
        return dict(self.state.ready)

    @property
    def maybe_throttled(self) -> set[str]:
        now = self.monotonic()
        return {h for h, t in self.state.ready.items() if t > now}

    @property
    def in_flight(self) -> dict[str, int]:
        return self.places.snapshot()

    # -- paced --------------------------------------------------------------------------------------

    def _refuse_if_full(self, host: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        """Bound every line: beyond ``max_queue`` waiters in this proxy, or beyond the pipeline's own
        ``max_queued``, refuse at once (the caller answers 503 with a Retry-After)."""
        if self.state.total + self.places.waiting >= self.settings.max_queue:
            self.report.rejected(host, "queue_full", pipeline)
            raise WaitTooLong(1.0, f"{self.settings.max_queue} requests are waiting already", "queue_full")
        rule = self._rules.get(pipeline)
        if rule is not None and rule.max_queued is not None:
            mine = self.state.pipeline_depth(pipeline) + self.places.waiting_by_pipeline.get(pipeline, 0)
            if mine >= rule.max_queued:
                self.report.rejected(host, "max_queued", pipeline)
                wait = max(1.0, mine * self.settings.gap)
                raise WaitTooLong(wait, f"pipeline {pipeline} has {mine} requests waiting", "max_queued")

    async def wait_paced(
        self, host: str, arrived: float | None = None, pipeline: str = DEFAULT_PIPELINE
    ) -> float:
        """Wait for a slot for ``host`` in ``pipeline``'s fair share; return seconds waited. Raises
        WaitTooLong."""
        self.start()
        s = self.settings
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + s.max_wait
        est = self.state.estimate(host, now, s.gap, s.interval_for(host), pipeline)
        if now + est > deadline:
            self.report.rejected(host, "max_wait", pipeline)
            raise WaitTooLong(est, f"{host} is paced and this request would wait {est:.1f}s")
        if s.gap <= 0 and not self.state.depth(host) and self.state.ready_at(host) <= now:
            if await self._claim_here(host, now, deadline, pipeline):
                return self._waited(host, Klass.PACED, arrived, pipeline)
        self._refuse_if_full(host, pipeline)
        w = Waiter(host, arrived, deadline, asyncio.get_running_loop().create_future(), pipeline)
        self.state.add(w)
        self.dispatcher.wake.set()
        try:
            async with asyncio.timeout(max(0.0, deadline - now) + 0.05):
                await w.ticket
        except TimeoutError:
            wait = self.state.estimate(host, self.monotonic(), s.gap, s.interval_for(host), pipeline)
            self.report.rejected(host, "max_wait", pipeline)
            raise WaitTooLong(max(wait, 1.0), f"{host} is paced and the wait exceeded max_wait") from None
        finally:
            self.state.remove(w)
        return self._waited(host, Klass.PACED, arrived, pipeline)

    async def _claim_here(self, host: str, now: float, deadline: float, pipeline: str) -> bool:
        """Global pacing off and nobody ahead for this host: claim in this task, skipping the hand-off to
        the dispatcher. The store still answers, so a host's interval and backoff still hold."""
        try:
            c = await self.store.claim(host, 0.0, self.settings.interval_for(host), deadline - now)
        except StoreError:
            return False
        if c.granted and c.wait <= 0:
            self.dispatcher.grants += 1
            self.state.charge(pipeline)
            self.report.granted(host, 0.0, pipeline)
            return True
        if c.outcome is Outcome.HOST_NOT_READY:
            self.state.set_ready(host, now + c.wait, now)
        return False

    def _waited(self, host: str, klass: Klass, arrived: float, pipeline: str) -> float:
        waited = self.monotonic() - arrived
        self.report.waited(host, klass, waited, pipeline)
        return waited

    # -- exempt -------------------------------------------------------------------------------------

    @asynccontextmanager
    async def exempt(
        self, host: str, arrived: float | None = None, pipeline: str = DEFAULT_PIPELINE
    ) -> AsyncIterator[float]:
        """Hold one of the host's exempt places for the whole exchange (shared fairly between pipelines);
        yields seconds waited."""
        waited = await self.exempt_enter(host, arrived, pipeline)
        try:
            yield waited
        finally:
            self.places.release(host, pipeline)

    async def exempt_enter(self, host: str, arrived: float | None, pipeline: str) -> float:
        """Wait for the exempt slot and one of the host's places; seconds waited. The caller releases the
        place (``places.release``); on WaitTooLong nothing is held."""
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + self.settings.max_wait
        try:
            await exempt_slot(
                self.store, self.settings, host, deadline, self.monotonic,
                lambda: self.state.ready_at(host), lambda e: self._errors.error("taking an exempt slot", e),
            )  # fmt: skip
        except WaitTooLong as e:
            self.report.rejected(host, "max_wait", pipeline)
            e.why += self.rest.note(host)
            raise
        if self.places.in_flight(host) >= self.settings.exempt_max_in_flight:
            self._refuse_if_full(host, pipeline)
        try:
            async with asyncio.timeout(max(0.0, deadline - self.monotonic())):
                await self.places.acquire(host, pipeline)
        except TimeoutError:
            self.report.rejected(host, "max_wait", pipeline)
            n = self.places.in_flight(host)
            raise WaitTooLong(1.0, f"{host} has {n} exempt reads in flight") from None
        try:
            return self._waited(host, Klass.EXEMPT, arrived, pipeline)
        except BaseException:
            self.places.release(host, pipeline)
            raise

    async def _backoff_in(self, host: str, now: float) -> float:
        """The host's backoff left, from the store; from the local hint when the store cannot answer."""
        try:
            return (await self.store.host_view(host)).backoff_in
        except Exception as e:  # noqa: BLE001 - a store fault must not turn an exempt read into a 500
            self._errors.error("reading a host's backoff", e)
            return max(0.0, self.state.ready_at(host) - now)

    # -- the facade ---------------------------------------------------------------------------------

    def permit(
        self, host: str, klass: Klass, arrived: float | None = None, pipeline: str | None = None
    ) -> Permit:
        """Hold the request until it may go (a slot, or an exempt place); raises WaitTooLong on entering.

        ``pipeline`` names who asks (the proxy user name, else the client address); it is mapped to a
        bounded name (``Pacer.pipeline``), and slots and exempt places are shared fairly between them."""
        return Permit(self, host, klass, 0.0, self.pipeline(pipeline), arrived)

    async def feedback(self, host: str, status: int | None, retry_after: str | None) -> Delay | None:
        """Record an answer in a task of our own, shielded from the caller's cancellation."""
        if self.answer_kind(status) is None and not self._success_due(host, self.monotonic()):
            return None  # the usual success, no store write due: nothing to shield, so no task (hot path)
        ra = parse_retry_after(retry_after, time.time())
        task = asyncio.get_running_loop().create_task(self.record(host, status, ra))
        self._feedback_tasks.add(task)
        task.add_done_callback(self._feedback_tasks.discard)
        return await asyncio.shield(task)

    # -- answers ------------------------------------------------------------------------------------

    def is_throttle(self, status: int | None) -> bool:
        return self.answer_kind(status) is not None

    def answer_kind(self, status: int | None) -> Kind | None:
        """What an answer says (issue 12): a block (403), a throttle, a failure (no answer), or None."""
        if status is None:
            return Kind.FAILURE
        if status in self.settings.block_codes:
            return Kind.BLOCK
        return Kind.THROTTLE if status in self.settings.throttle_codes else None

    async def record(self, host: str, status: int | None, retry_after: float | None) -> Delay | None:
        """Feed an upstream answer back; ``status`` None means the connection failed or timed out.

        Never raises on a store error: the local hint still holds the host back for the delay."""
        if (kind := self.answer_kind(status)) is not None:
            return await self._throttled(host, status, retry_after, kind)
        # A success resets the count even when the throttles were recorded by another proxy sharing the
        # store, or by this one before a restart; checking at most once a second keeps the store quiet.
        if self._success_due(host, now := self.monotonic()):
            self._mark_checked(host, now)
            try:
                await self.store.succeeded(host)
            except Exception as e:  # noqa: BLE001 - feedback never raises; the next success retries
                self._errors.error("recording a success", e)
                self._checked.pop(host, None)
        return None

    async def _throttled(
        self, host: str, status: int | None, retry_after: float | None, kind: Kind = Kind.THROTTLE
    ) -> Delay:
        s = self.settings
        base = max(s.gap, s.interval_for(host))  # the rate the adaptive interval is raised from
        try:
            delay = await self.store.throttled(host, retry_after, s.backoff, kind, base)
        except Exception as e:  # noqa: BLE001 - the throttle still applies here, from the local hint
            self._errors.error("recording a throttle", e)
            delay = answer_delay(HostState(), kind, retry_after, s.backoff, 0.5)
        self.rest.remember(host, Kind.BLOCK if delay.block else kind, delay.seconds)
        now = self.monotonic()
        self.state.hold(host, now + delay.seconds, now)
        self._checked.pop(host, None)  # the next success must reset the count in the store
        self.events.throttled(host, status or 0, delay.seconds)
        if delay.capped_from is not None:
            log.warning("%s: Retry-After %.0fs cut to the %.0fs cap", host, delay.capped_from, delay.seconds)
        self.dispatcher.wake.set()
        return delay

    def state_note(self, host: str) -> str:
        """The "; <host> is blocked until <time>" (or backing off) note, when this proxy knows it rests."""
        return self.rest.note(host)

    def _success_due(self, host: str, now: float) -> bool:
        """Must this success reach the store: not checked here within SUCCESS_RECHECK, or our probe?"""
        last = self._checked.get(host)
        return last is None or now - last >= SUCCESS_RECHECK or self.store.probing(host)

    def _mark_checked(self, host: str, now: float) -> None:
        self._checked.pop(host, None)  # re-inserted last: the dict's order is the order of checks
        self._checked[host] = now
        if len(self._checked) > HINT_CAP:
            stale = [h for h, t in self._checked.items() if now - t >= SUCCESS_RECHECK]
            for h in stale or [next(iter(self._checked))]:
                del self._checked[h]

    async def host_view(self, host: str) -> HostView:
        return await self.store.host_view(host)

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        """Remember a robots.txt Crawl-delay (already capped) for ``ttl`` seconds, for every proxy."""
        await self.store.set_crawl_delay(host, delay, ttl)
