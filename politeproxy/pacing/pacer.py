"""The pacer facade: one call holds a request until it may go, and takes the upstream's answer back.

The parts: ``state`` (pure per-host lines, ready hints, the estimate), ``dispatcher`` (the one loop that
claims slots from the store), ``exempt`` (per-host places for exempt reads), ``permit`` (one request's
turn), ``snapshot`` (the frozen copy every reader gets). Every per-host table is bounded: lines and places
vanish when they empty, hints and success checks have caps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from politeproxy.pacing.base import (
    DEFAULT_MAX_QUEUE,
    INDEX_HOST_INTERVAL,
    PacerEvents,
    PacingSettings,
    RepeatLog,
    WaitTooLong,
)
from politeproxy.pacing.dispatcher import Dispatcher, wait_for_grant
from politeproxy.pacing.exempt import ExemptPlaces
from politeproxy.pacing.holding import Holds
from politeproxy.pacing.permit import Permit
from politeproxy.pacing.quota import Quotas
from politeproxy.pacing.rest import RestNotes, exempt_slot, index_rested, is_index_warning
from politeproxy.pacing.snapshot import PacerSnapshot, take
from politeproxy.pacing.state import HINT_CAP, QueueState, SuccessChecks, Waiter
from politeproxy.policy.backoff import Delay, Kind, answer_delay, parse_retry_after
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE, FAIR_NAMES, PipelineNames, PipelineRule
from politeproxy.policy.signals import Signal
from politeproxy.policy.slots import HostState
from politeproxy.stores.base import HostView, Store
from politeproxy.stores.holdnotes import HoldNotes

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "INDEX_HOST_INTERVAL",
    "Pacer",
    "PacerEvents",
    "PacerSnapshot",
    "PacingSettings",
    "Permit",
    "WaitTooLong",
]

log = logging.getLogger("politeproxy.pacing.pacer")

FEEDBACK_CLOSE_TIMEOUT = 5.0  # close() waits this long for feedback still being recorded
MAX_REMEMBERED_NAMES = 1024  # requested pipeline names remembered with the name each counts as


class Pacer:
    """One request budget for every paced host. Use it as aiolimiter's limiters are used::

        async with pacer.permit(host, Klass.PACED) as p:      # waits for a slot, or raises WaitTooLong
            resp = await send(...)
            delay = await p.answered(resp.status, resp.headers.get("Retry-After"))

    ``Klass.EXEMPT`` holds one of the host's exempt places for the block instead of a slot; ``p.probe``
    says the grant is the one request after a block, ``p.waited`` how long it was held, ``p.retry`` whether
    to try a throttled request again; a refusal's ``note`` says why the host rests.

    The door: ``permit``, ``snapshot`` (every read for status, health and gauges), ``start``, ``close``,
    ``reload``, and the read-only ``settings`` and ``monotonic``; ``holds`` says why hosts are held and
    lifts a hold (``politeproxy release``). Beside it, three small calls:
    ``pipeline_of`` (the bounded name a client counts as: the proxy labels an exchange with it before the
    cache answers, so before any permit) and ``host_view`` (a host's record: the status document, the
    backoff gauges, the robots.txt watcher) with ``set_crawl_delay`` (the watcher's robots.txt delay).
    Everything else is private: nothing outside the pacing package calls the store.
    """

    def __init__(
        self,
        store: Store,
        settings: PacingSettings | None = None,
        events: PacerEvents | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        notes: HoldNotes | None = None,
    ) -> None:
        self._store = store
        self._settings = settings or PacingSettings()
        self._events: PacerEvents = events or PacerEvents()  # the family itself hears nothing
        self.monotonic = monotonic  # the pacer's clock (injected: a virtual one in tests)
        self._dispatcher = Dispatcher(QueueState(), store, lambda: self._settings, self._events, monotonic)
        self._state: QueueState[asyncio.Future[float]] = self._dispatcher.state
        self._state.on_line = self._events.line_changed
        self._places = ExemptPlaces(
            lambda: self._settings.exempt_max_in_flight, self._events.exempt_changed, lambda: self._weights
        )
        self._pipelines = PipelineNames(free=FAIR_NAMES)  # labels are bounded apart (observe/metrics.py)
        # Requested name -> the name it counts as, remembered (asked twice per request). Client-chosen
        # keys, so cleared at MAX_REMEMBERED_NAMES, and on configure (a name may become configured).
        self._named: dict[str | None, str] = {}
        self._rules: dict[str, PipelineRule] = {}
        self._weights: dict[str, float] = {}
        self._configure_pipelines(self._settings.pipelines)
        self._checked = SuccessChecks()  # when a success here last reset each host's count in the store
        self._errors = RepeatLog(log, monotonic)
        self._task: asyncio.Task[None] | None = None
        self._feedback_tasks: set[asyncio.Task[Delay | None]] = set()
        self._rest = RestNotes(HINT_CAP)  # what rests each host, for the body of our own refusals
        self.holds = Holds(store, self._state, self._rest, monotonic, notes, wake=self._dispatcher.wake.set)
        self._watch: asyncio.Task[None] | None = None
        # what is left of each service's window, for the RateLimit fields (issue 41)
        self.quotas = Quotas(store, lambda: self._settings, monotonic, self._estimate)

    def _estimate(self, host: str) -> float:
        s = self._settings
        return self._state.estimate(host, self.monotonic(), s.gap, s.interval_for(host))

    @property
    def settings(self) -> PacingSettings:
        """The settings in force (frozen; ``reload`` replaces them)."""
        return self._settings

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatcher.run())
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self.holds.watch())

    async def close(self) -> None:
        """Wait (bounded) for feedback still being recorded, stop the dispatcher, refuse who is left."""
        pending = set(self._feedback_tasks)
        if pending:
            _done, late = await asyncio.wait(pending, timeout=FEEDBACK_CLOSE_TIMEOUT)
            if late:
                msg = "%d answers not recorded within %.0fs at shutdown"
                log.warning(msg, len(late), FEEDBACK_CLOSE_TIMEOUT)
                for t in late:
                    t.cancel()
                await asyncio.wait(late, timeout=1.0)
        tasks = [t for t in (self._task, self._watch) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each ends cancelled
        self._task = self._watch = None
        await self.holds.close()
        await self.quotas.close()
        self._dispatcher.refuse_all("proxy shutting down")

    def reload(self, settings: PacingSettings) -> None:
        """New settings from a config reload: waiters see them at once (and more exempt places open)."""
        self._settings = settings
        self._configure_pipelines(settings.pipelines)
        self._dispatcher.wake.set()
        self._places.resize()

    def _configure_pipelines(self, rules: tuple[PipelineRule, ...]) -> None:
        """The configured pipelines keep their names whatever else comes; their weights feed the fair
        queue (paced slots) and the exempt places alike."""
        self._rules = {r.name: r for r in rules}
        self._weights = {r.name: r.weight for r in rules}
        self._pipelines.configure(self._rules)
        self._named.clear()
        self._state.tags.weights = self._weights

    # -- reads ----------------------------------------------------------------------------------------

    def snapshot(self) -> PacerSnapshot:
        """The one read path for status, health and gauges: a frozen copy of the counts now."""
        store = (self._store.name, self._store.degraded)  # only a failover store ever degrades
        return take(
            self.monotonic(), self._settings, self._dispatcher.grants, self._state, self._places, store,
            self._rest.reasons(),
        )  # fmt: skip

    def pipeline_of(self, name: str | None) -> str:
        """The pipeline a requested name counts as (bounded, names expire; None: the default pipeline)."""
        now = self.monotonic()
        counted = self._named.get(name)
        if counted is not None:
            self._pipelines.touch(counted, now)
            return counted
        expired = self._pipelines.expired
        counted = self._pipelines.counted_as(name or DEFAULT_PIPELINE, now)
        if len(self._named) >= MAX_REMEMBERED_NAMES or self._pipelines.expired != expired:
            self._named.clear()  # a name that gave its place up must be counted afresh
        self._named[name] = counted
        return counted

    # -- paced --------------------------------------------------------------------------------------

    def _refuse_if_full(self, host: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        """Bound every line: beyond ``max_queue`` waiters in this proxy, or beyond the pipeline's own
        ``max_queued``, refuse at once (the caller answers 503 with a Retry-After)."""
        if self._state.total + self._places.waiting >= self._settings.max_queue:
            self._events.rejected(host, "queue_full", pipeline)
            raise WaitTooLong(1.0, f"{self._settings.max_queue} requests are waiting already", "queue_full")
        rule = self._rules.get(pipeline)
        if rule is not None and rule.max_queued is not None:
            mine = self._state.pipeline_depth(pipeline) + self._places.waiting_by_pipeline.get(pipeline, 0)
            if mine >= rule.max_queued:
                self._events.rejected(host, "max_queued", pipeline)
                wait = max(1.0, mine * self._settings.gap)
                raise WaitTooLong(wait, f"pipeline {pipeline} has {mine} requests waiting", "max_queued")

    async def _wait_paced(
        self,
        host: str,
        arrived: float | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        bound: float | None = None,
        again: bool = False,
    ) -> float:
        """Wait for a slot for ``host`` in ``pipeline``'s fair share, at most ``bound`` (None: max_wait)
        from ``arrived``; return seconds waited. Raises WaitTooLong, at once when the wait is known to be
        longer. ``again``: a client's retry of a refused request, queued ahead of first tries."""
        self.start()
        s = self._settings
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + (s.max_wait if bound is None else bound)
        est = self._state.estimate(host, now, s.gap, s.interval_for(host), pipeline, again)
        if now + est > deadline:
            self._events.rejected(host, "max_wait", pipeline)
            raise WaitTooLong(est, f"{host} is paced and this request would wait {est:.1f}s")
        if s.gap <= 0 and not self._state.depth(host) and self._state.ready_at(host) <= now:
            if await self._dispatcher.claim_here(host, now, deadline, pipeline):
                return self._waited(host, Klass.PACED, arrived, pipeline)
        self._refuse_if_full(host, pipeline)
        w = Waiter(host, arrived, deadline, asyncio.get_running_loop().create_future(), pipeline, again=again)
        self._state.add(w)
        self._dispatcher.wake.set()
        try:
            if not await wait_for_grant(w, max(0.0, deadline - now) + 0.05, self.monotonic):
                wait = self._state.estimate(host, self.monotonic(), s.gap, s.interval_for(host), pipeline)
                self._events.rejected(host, "max_wait", pipeline)
                raise WaitTooLong(max(wait, 1.0), f"{host} is paced and the wait exceeded max_wait")
        finally:
            if not w.ticket.done():
                w.ticket.cancel()  # a refused or departed waiter: the dispatcher passes its slot on
            self._state.remove(w)
        return self._waited(host, Klass.PACED, arrived, pipeline)

    def _waited(self, host: str, klass: Klass, arrived: float, pipeline: str) -> float:
        waited = self.monotonic() - arrived
        self._events.waited(host, klass, waited, pipeline)
        return waited

    # -- exempt -------------------------------------------------------------------------------------

    async def _exempt_enter(
        self, host: str, arrived: float | None, pipeline: str, bound: float | None = None
    ) -> float:
        """Wait for one of the host's places, then its exempt slot; seconds waited. The place comes first:
        the slot counts in the request window at once, so a read must leave at its slot, not a place's wait
        later. The permit gives the place back (``_exempt_leave``); on WaitTooLong nothing is held."""
        now = self.monotonic()
        arrived = now if arrived is None else arrived
        deadline = arrived + (self._settings.max_wait if bound is None else bound)
        if self._places.in_flight(host) >= self._settings.exempt_max_in_flight:
            self._refuse_if_full(host, pipeline)
        try:
            async with asyncio.timeout(max(0.0, deadline - self.monotonic())):
                await self._places.acquire(host, pipeline)
        except TimeoutError:
            self._events.rejected(host, "max_wait", pipeline)
            n = self._places.in_flight(host)
            raise WaitTooLong(1.0, f"{host} has {n} exempt reads in flight") from None
        try:
            await exempt_slot(
                self._store, self._settings, host, deadline, self.monotonic,
                lambda: self._state.ready_at(host), lambda e: self._errors.error("taking an exempt slot", e),
            )  # fmt: skip
            return self._waited(host, Klass.EXEMPT, arrived, pipeline)
        except BaseException as e:
            self._places.release(host, pipeline)
            if isinstance(e, WaitTooLong):
                self._events.rejected(host, "max_wait", pipeline)
            raise

    def _exempt_leave(self, host: str, pipeline: str) -> None:
        self._places.release(host, pipeline)

    # -- the door -----------------------------------------------------------------------------------

    def permit(
        self,
        host: str,
        klass: Klass,
        arrived: float | None = None,
        pipeline: str | None = None,
        bound: float | None = None,
        again: bool = False,
    ) -> Permit:
        """Hold the request until it may go (a slot, or an exempt place); raises WaitTooLong on entering.

        ``pipeline`` names who asks (the proxy user name, else the client address); it is mapped to a
        bounded name (``Pacer.pipeline``), and slots and exempt places are shared fairly between them.
        ``bound``: the longest it may be held (its client's rule, ``settings.bound_for``); None: max_wait.
        ``again``: the client's retry of a refused request (``policy.clients.sdk_attempt``)."""
        return Permit(self, host, klass, 0.0, self.pipeline_of(pipeline), arrived, bound, again)

    async def _rest_note(self, host: str, wait: float) -> str:
        """Why ``host`` rests, when this proxy knows or (a wait this long) another proxy noted it."""
        return self._rest.note(host) or (await self.holds.learn(host) if wait > 1.0 else "")

    async def _feedback(
        self, host: str, status: int | None, retry_after: str | None, signal: Signal | None = None
    ) -> Delay | None:
        """Record an answer in a task of our own, shielded from the caller's cancellation."""
        kind = self._answer_kind(host, status, signal)
        if kind is None and not self._success_due(host, self.monotonic()):
            return None  # the usual success, no store write due: nothing to shield, so no task (hot path)
        ra = parse_retry_after(retry_after, time.time())
        task = asyncio.get_running_loop().create_task(self._record(host, status, ra, signal))
        self._feedback_tasks.add(task)
        task.add_done_callback(self._feedback_tasks.discard)
        return await asyncio.shield(task)

    # -- answers ------------------------------------------------------------------------------------

    def _answer_kind(self, host: str, status: int | None, signal: Signal | None = None) -> Kind | None:
        """What an answer says (issue 12), read by its cause (issue 24): a block (403 from CloudFront or
        from nobody known), a throttle, a failure (no answer), or None: an ordinary answer, and so an S3
        denial or a 404 (it came through, so it ends a block like any success); the index's 502/504 too."""
        if signal is not None and not signal.cause.records:
            return None
        if status is None:
            return Kind.FAILURE
        if status in self._settings.block_codes:
            return Kind.BLOCK
        warns = status in self._settings.throttle_codes or is_index_warning(host, status, self._settings)
        return Kind.THROTTLE if warns else None

    async def _record(
        self, host: str, status: int | None, retry_after: float | None, signal: Signal | None = None
    ) -> Delay | None:
        """Feed an upstream answer back (``status`` None: no answer). Never raises on a store error: the
        local hint still holds the host back for the delay."""
        if (kind := self._answer_kind(host, status, signal)) is not None:
            why = signal.reason(status) if signal is not None else None
            return await self._throttled(host, status, retry_after, kind, why)
        # A success resets the count even when the throttles were recorded by another proxy sharing the
        # store, or by this one before a restart; checking at most once a second keeps the store quiet.
        if self._success_due(host, now := self.monotonic()):
            self._checked.mark(host, now)
            try:
                await self._store.succeeded(host)
            except Exception as e:  # noqa: BLE001 - feedback never raises; the next success retries
                self._errors.error("recording a success", e)
                self._checked.forget(host)
        return None

    async def _throttled(
        self, host: str, status: int | None, retry_after: float | None, kind: Kind, why: str | None
    ) -> Delay:
        s = self._settings
        base = s.pace_for(host)  # the rate the adaptive interval is raised from
        try:
            delay = await self._store.throttled(host, retry_after, s.backoff, kind, base)
        except Exception as e:  # noqa: BLE001 - the throttle still applies here, from the local hint
            self._errors.error("recording a throttle", e)
            delay = answer_delay(HostState(), kind, retry_after, s.backoff, 0.5)
        reason = why or (f"{status} from upstream" if status is not None else "no answer from upstream")
        if not delay.block and is_index_warning(host, status, s):
            delay, reason = await index_rested(self._store, host, retry_after, delay, s, reason)
        self._rest.remember(host, Kind.BLOCK if delay.block else kind, delay.seconds, reason)
        self.holds.held(host, delay.block, status, delay.seconds, reason)
        now = self.monotonic()
        self._state.hold(host, now + delay.seconds, now)
        self._checked.forget(host)  # the next success must reset the count in the store
        self._events.throttled(host, status or 0, delay.seconds)
        if delay.capped_from is not None:
            log.warning("%s: Retry-After %.0fs cut to the %.0fs cap", host, delay.capped_from, delay.seconds)
        self._dispatcher.wake.set()
        return delay

    def _probing(self, host: str) -> bool:
        """Is this process's unanswered probe of ``host`` out? (The store remembers the ones it granted.)"""
        return self._store.probing(host)

    def _success_due(self, host: str, now: float) -> bool:
        """Must this success reach the store: not checked here lately, or it answers our probe?"""
        return self._checked.due(host, now) or self._store.probing(host)

    # Host records are read, and robots.txt's Crawl-delay written, through the pacer, not the store.
    async def host_view(self, host: str) -> HostView:
        """The store's record of ``host`` (backoff, interval, Crawl-delay), for every proxy sharing it."""
        return await self._store.host_view(host)

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        """Remember a robots.txt Crawl-delay (already capped) for ``ttl`` seconds, for every proxy."""
        await self._store.set_crawl_delay(host, delay, ttl)
