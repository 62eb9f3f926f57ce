"""The ``GET /status`` document: per host, per pipeline and overall, built from the pacer, the store and the
tallies below, and a 15-minute history of achieved against configured rate.

Every table here is bounded: the hosts shown (``MAX_HOSTS``), the pipelines tallied (``MAX_TALLIES``, names
already bounded by the pacer), the waits kept per pipeline (``WAITS_KEPT``) and the history ring
(``HISTORY_SPAN / step`` points). A document is built at most every ``CACHE_FOR`` seconds, whoever asks,
and its store reads are bounded by ``STORE_READ_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from politeproxy import __version__
from politeproxy.cache.base import INDEX_RESULTS, CacheEvents
from politeproxy.observe.fanout import FAMILIES, join_into
from politeproxy.observe.hostrows import host_row, num
from politeproxy.observe.metricparts import RateWindow
from politeproxy.pacing.base import PacerEvents
from politeproxy.pacing.pacer import Pacer, PacerSnapshot
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import OTHER_PIPELINE
from politeproxy.policy.holds import HoldNote
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.stores.base import HostView

HISTORY_SPAN = 900.0  # seconds of history kept (15 min)
HISTORY_STEP = 5.0  # seconds between history points; POLITEPROXY_STATUS_STEP (0.5..60) changes it
GRANT_WINDOW = 60.0  # "grants in the last minute" and the achieved rate
RATE_FLOOR = 10.0  # the achieved rate is over the last this many seconds (issue 26: a minute's average
# showed 0.18/s with 24 requests queued at full speed, a burst ago)
WAIT_WINDOW = 300.0  # the wait p50 looks at waits this recent
WAITS_KEPT = 128  # waits kept per pipeline for the p50
MAX_TALLIES = 128  # pipelines tallied at most (the pacer keeps at most configured + 50 + other)
MAX_HOSTS = 64  # host rows at most: the configured hosts first, then the busiest
MAX_PIPELINE_ROWS = 64
CACHE_FOR = 0.5  # seconds a built document is served again
STORE_READ_TIMEOUT = 1.0  # all store reads of one document together


def history_step(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """The history step from POLITEPROXY_STATUS_STEP, when it is a finite number within 0.5..60 s."""
    try:
        v = float(env.get("POLITEPROXY_STATUS_STEP", "") or HISTORY_STEP)
    except ValueError:
        return HISTORY_STEP
    return v if math.isfinite(v) and 0.5 <= v <= 60.0 else HISTORY_STEP


class Tally:
    """One pipeline's recent grants (1 s slices over a minute), paced waits, and the host it last used."""

    __slots__ = ("grants", "last_host", "waits")

    def __init__(self) -> None:
        self.grants = RateWindow(GRANT_WINDOW, int(GRANT_WINDOW))
        self.waits: deque[tuple[float, float]] = deque(maxlen=WAITS_KEPT)  # (monotonic time, seconds)
        self.last_host: str | None = None

    def idle(self, now: float) -> bool:
        return not self.grants.count(now) and not any(now - t < WAIT_WINDOW for t, _w in self.waits)

    def wait_p50(self, now: float) -> float | None:
        recent = [w for t, w in self.waits if now - t < WAIT_WINDOW]
        return statistics.median(recent) if recent else None


class StatusEvents(PacerEvents, ProxyEvents, CacheEvents):
    """The status view's sink: grants and paced waits tallied per pipeline, cache results counted, for the
    status document. Made with a ``sink`` (``Metrics``), it stands in for it: every event of the three
    families reaches the sink, and those heard here reach this too (``fanout.join_into``), so app.py
    hands one object to the pacer and the cache. Only what the document counts is written here."""

    def __init__(self, sink: object | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.clock = clock
        self.total = RateWindow(GRANT_WINDOW, int(GRANT_WINDOW))
        self.tallies: dict[str, Tally] = {}
        self.cache_counts = dict.fromkeys(("hit", "miss", "stale", "bypass", "slots_saved", "evicted"), 0)
        self.cache_bytes: int | None = None
        self.index_counts: dict[str, dict[str, int]] = {}  # pipeline -> INDEX_RESULTS counts, bounded
        if sink is not None:
            join_into(self, FAMILIES, (sink, self))

    def tally(self, pipeline: str) -> Tally:
        t = self.tallies.get(pipeline)
        if t is None:
            # A backstop (the pacer's names are bounded already); the last place is kept for "other".
            if len(self.tallies) >= MAX_TALLIES - 1 and pipeline != OTHER_PIPELINE:
                pipeline = OTHER_PIPELINE
            t = self.tallies.setdefault(pipeline, Tally())
        return t

    # -- what the document counts (every other event goes to the sink alone) -------------------------

    def granted(self, host: str, lateness: float, pipeline: str) -> None:
        now = self.clock()
        self.total.add(now)
        t = self.tally(pipeline)
        t.grants.add(now)
        t.last_host = host

    def waited(self, host: str, klass: Klass, seconds: float, pipeline: str) -> None:
        if klass is Klass.PACED and math.isfinite(seconds):
            self.tally(pipeline).waits.append((self.clock(), seconds))

    def cache_result(self, result: str, pipeline: str) -> None:
        if result in self.cache_counts:
            self.cache_counts[result] += 1

    def index_question(self, result: str, pipeline: str) -> None:
        if result in INDEX_RESULTS:
            if pipeline not in self.index_counts and len(self.index_counts) >= MAX_TALLIES - 1:
                pipeline = OTHER_PIPELINE  # a backstop, as for the tallies: names are bounded already
            counts = self.index_counts.setdefault(pipeline, dict.fromkeys(INDEX_RESULTS, 0))
            counts[result] += 1

    def cache_slot_saved(self, pipeline: str) -> None:
        self.cache_counts["slots_saved"] += 1

    def cache_size(self, nbytes: int) -> None:
        self.cache_bytes = nbytes

    def cache_evicted(self, n: int) -> None:
        self.cache_counts["evicted"] += n

    def cache_view(self) -> dict[str, Any]:
        c = self.cache_counts
        looked = c["hit"] + c["miss"] + c["stale"]
        index = {f"index_{r}": sum(p[r] for p in self.index_counts.values()) for r in INDEX_RESULTS}
        return {
            **c,
            **index,
            "bytes": self.cache_bytes,
            "hit_rate": num(c["hit"] / looked) if looked else None,
            "index_pipelines": {p: dict(v) for p, v in sorted(self.index_counts.items())},
        }

    def prune(self, now: float) -> None:
        for name in [n for n, t in self.tallies.items() if t.idle(now)]:
            del self.tallies[name]


class History:
    """Achieved against configured rate, one point per ``step`` seconds over ``HISTORY_SPAN`` (a ring)."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.points: deque[list[float | None]] = deque(maxlen=math.ceil(HISTORY_SPAN / step))
        self._last: tuple[float, int] | None = None  # (monotonic time, grants) of the previous sample

    def sample(self, mono: float, wall: float, grants: int, configured: float, queued: int) -> None:
        last, self._last = self._last, (mono, grants)
        if last is None or mono <= last[0]:
            return
        achieved = max(0, grants - last[1]) / (mono - last[0])
        self.points.append([round(wall, 3), num(achieved), num(configured), queued])

    def partial(
        self, mono: float, wall: float, grants: int, configured: float, queued: int
    ) -> list[float | None] | None:
        """The bucket in progress (since the last point), as a point: the chart's last bucket is drawn from
        what it holds so far, not as zero (issue 26); None until a tenth of a step has passed."""
        last = self._last
        if last is None or mono - last[0] < self.step / 10:
            return None
        achieved = max(0, grants - last[1]) / (mono - last[0])
        return [round(wall, 3), num(achieved), num(configured), queued]


class StatusBoard:
    """Builds the status document; ``run`` samples the history. The composition root makes one."""

    def __init__(
        self,
        pacer: Pacer,
        events: StatusEvents,
        hosts: list[str],
        backend: str,
        step: float | None = None,
    ) -> None:
        self.pacer = pacer
        self.events = events
        self.hosts = list(hosts)[:MAX_HOSTS]  # the configured concrete hosts: always shown
        self.backend = backend
        self.started = pacer.monotonic()
        self.history = History(step or history_step())
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self.proxies: Callable[[], list[dict[str, Any]]] | None = None  # live proxies (observe.announce)
        self.carried = 0  # grants of this worker's earlier lives (observe/workers.py), in grants_since_start
        self.config: Callable[[], dict[str, Any]] | None = None  # the config file: its path, whether read

    async def run(self) -> None:
        self.sample()  # the first point comes one step after start
        while True:
            await asyncio.sleep(self.history.step)
            self.sample()

    def sample(self) -> None:
        snap = self.pacer.snapshot()
        gap = snap.gap
        self.history.sample(snap.at, time.time(), snap.grants, 1.0 / gap if gap > 0 else 0.0, snap.queued)
        self.events.prune(snap.at)

    def granted(self) -> int:
        """This process's grants since it started (without ``carried``)."""
        return self.pacer.snapshot().grants

    def invalidate(self) -> None:
        """The next document is built afresh (a release changed what it says)."""
        self._cached = None

    async def document(self) -> dict[str, Any]:
        """The document, built afresh at most every ``CACHE_FOR`` seconds (one build at a time)."""
        async with self._lock:
            c = self._cached
            if c is None or self.pacer.monotonic() - c[0] >= CACHE_FOR:
                c = self._cached = (self.pacer.monotonic(), await self._build())
        return c[1]

    async def _build(self) -> dict[str, Any]:
        snap = self.pacer.snapshot()
        names = self._host_names(snap)
        views = await self._views(names)
        notes = await self._notes(names)
        hosts = [host_row(h, views.get(h), snap, notes.get(h)) for h in names]
        intervals = {row["host"]: row["effective_interval_s"] or 0.0 for row in hosts}
        pipelines = self._pipelines(snap, intervals)
        return {
            "version": __version__,
            "time": round(time.time(), 3),
            "uptime_s": num(snap.at - self.started, 1),
            "config": self.config() if self.config else None,
            # The store as it stands after this document's reads: one that failed over shows at once.
            "overall": self._overall(snap, self.pacer.snapshot()),
            "hosts": hosts,
            "hosts_omitted": max(0, len(self._candidates(snap)) - len(names)),
            "windows": await self._windows(snap),
            "pipelines": pipelines[:MAX_PIPELINE_ROWS],
            "pipelines_omitted": max(0, len(pipelines) - MAX_PIPELINE_ROWS),
            "proxies": self.proxies() if self.proxies else [],
            "history": {
                "step_s": self.history.step,
                "span_s": HISTORY_SPAN,
                "fields": ["time", "achieved_rate", "configured_rate", "queued"],
                "points": list(self.history.points),
                "partial": self.history.partial(
                    snap.at, time.time(), snap.grants, 1.0 / snap.gap if snap.gap > 0 else 0.0, snap.queued
                ),
            },
        }

    def _candidates(self, snap: PacerSnapshot) -> set[str]:
        return set(self.hosts) | snap.hosts | set(snap.queued_by_host)

    def _host_names(self, snap: PacerSnapshot) -> list[str]:
        """The configured hosts, then the others this process knows of, busiest first, up to MAX_HOSTS."""
        others = self._candidates(snap) - set(self.hosts)
        busy = sorted(
            others, key=lambda h: (-snap.queued_by_host.get(h, 0), -snap.exempt_in_flight.get(h, 0), h)
        )
        return (self.hosts + busy)[:MAX_HOSTS]

    async def _views(self, hosts: list[str]) -> dict[str, HostView]:
        """Each host's view from the store; a host the store does not answer for in time is left out."""
        if not hosts:
            return {}
        tasks = {asyncio.ensure_future(self.pacer.host_view(h)): h for h in hosts}
        done, pending = await asyncio.wait(list(tasks), timeout=STORE_READ_TIMEOUT)
        for t in pending:
            t.cancel()
            # A read that fails while being cancelled: its error is read here, not logged as unretrieved.
            t.add_done_callback(lambda t: t.cancelled() or t.exception())
        out: dict[str, HostView] = {}
        for t in done:
            if not t.cancelled() and t.exception() is None:
                out[tasks[t]] = t.result()
        return out

    async def _notes(self, hosts: list[str]) -> dict[str, HoldNote]:
        try:
            async with asyncio.timeout(STORE_READ_TIMEOUT):
                return await self.pacer.holds.view(hosts)
        except TimeoutError:
            return {}

    async def _windows(self, snap: PacerSnapshot) -> list[dict[str, Any]]:
        """Each service's request window (issue 24): requests in it now, the limit, the share used."""
        rules = {r.service: r for h in self.hosts if (r := snap.settings.window_for(h)) is not None}
        try:
            async with asyncio.timeout(STORE_READ_TIMEOUT):
                used = await self.pacer.holds.windows(rules.values())
        except TimeoutError:
            return []
        return [
            {
                "service": r.service,
                "egress": r.egress,
                "window_s": num(r.seconds),
                "requests": n,
                "limit": r.limit,
                "share": num(n / r.limit if r.limit else 0.0),
            }
            for r, n in used
        ]

    def _pipelines(self, snap: PacerSnapshot, intervals: dict[str, float]) -> list[dict[str, Any]]:
        now = snap.at
        tallies = self.events.tallies
        names = set(snap.weights) | set(snap.queued_by_pipeline) | set(snap.exempt_waiting_by_pipeline)
        names |= set(tallies)
        counts = {p: (tallies[p].grants.count(now) if p in tallies else 0) for p in names}
        total = sum(counts.values())
        backlogged = [p for p in names if snap.queued_by_pipeline.get(p, 0)]
        weight_sum = sum(snap.weights.get(p, 1.0) for p in backlogged)
        rows: list[dict[str, Any]] = []
        for p in names:
            t = tallies.get(p)
            host = snap.busiest_host(p) or (t.last_host if t else None) or (self.hosts or ["-"])[0]
            queued = snap.queued_by_pipeline.get(p, 0)
            weight = snap.weights.get(p, 1.0)
            rows.append(
                {
                    "pipeline": p,
                    "queued": queued,
                    "exempt_waiting": snap.exempt_waiting_by_pipeline.get(p, 0),
                    "grants_last_minute": counts[p],
                    "share": num(counts[p] / total if total else 0.0),
                    "weight": num(weight),
                    "fair_share": num(weight / weight_sum) if queued and weight_sum > 0 else None,
                    "wait_p50_s": num(t.wait_p50(now) if t else None),
                    "next_host": host,
                    "expected_wait_s": num(snap.expected_wait(p, host, intervals.get(host))),
                }
            )
        rows.sort(key=lambda r: (-r["queued"], -r["grants_last_minute"], r["pipeline"]))
        return rows

    def _overall(self, snap: PacerSnapshot, after: PacerSnapshot | None = None) -> dict[str, Any]:
        # The last RATE_FLOOR seconds: what the schedule achieves now, not a minute's average.
        span = RATE_FLOOR
        minute = max(RATE_FLOOR, min(GRANT_WINDOW, snap.at - self.started))
        return {
            "configured_rate": num(1.0 / snap.gap if snap.gap > 0 else 0.0),
            "configured_gap_s": num(snap.gap),
            "achieved_rate": num(self.events.total.count_since(snap.at, span) / span),
            "achieved_window_s": num(span, 1),
            # and over the last minute (or since start, when sooner): the two side by side (issue 26)
            "achieved_rate_1m": num(self.events.total.count(snap.at) / minute),
            "grants_since_start": snap.grants + self.carried,
            "queued": snap.queued,
            "exempt_waiting": sum(snap.exempt_waiting_by_pipeline.values()),
            "exempt_in_flight": sum(snap.exempt_in_flight.values()),
            "cache": self.events.cache_view(),
            "store": {
                "backend": self.backend,
                "active": (after or snap).store,
                "degraded": (after or snap).degraded,
            },
        }
