"""Prometheus metrics. Counters and histograms are the truth; the achieved-rate gauge is for a glance.

Memory is bounded whatever clients send: the host label takes the pinned hosts (the configured concrete
hosts, index and data.commoncrawl.org) and the first ``FREE_HOST_LABELS`` other names seen, then ``other``;
the achieved rate is kept in 100 buckets per label, trimmed on every grant. The pipeline label (requests,
grants, wait, queue depth, rejections) is bounded the same way: the configured pipelines and the first
``policy.fairness.FREE_PIPELINES`` names seen, then ``other``.

Hygiene (issue 13): ``politeproxy_build_info`` names the version; ``prepare`` creates the label sets of the
configured hosts at 0 so a dashboard shows 0 rather than "No data" before the first request; no
``_created`` series (prometheus_client's ``disable_created_metrics``: they double the series count and no
panel reads them).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from politeproxy import __version__
from politeproxy.cache.base import INDEX_RESULTS, RESULTS, CacheEvents
from politeproxy.observe.inplace import CountTable, HistogramTable, InPlace
from politeproxy.observe.metricparts import (
    FREE_HOST_LABELS,
    OTHER,
    PINNED_HOSTS,
    RATE_WINDOW,
    HostLabelled,
    HostLabels,
    RateWindow,
    summed,
)
from politeproxy.pacing.base import PacerEvents, PacingSettings
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE, FREE_PIPELINES, PipelineNames
from politeproxy.policy.settings import MAX_PIPELINES
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.stores.base import BACKENDS

__all__ = ["FREE_HOST_LABELS", "OTHER", "PINNED_HOSTS", "Metrics", "RateWindow", "code_class"]

LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60)
STATUS_GROUPS = ("2xx", "3xx", "4xx", "5xx", "error")  # the code label of requests_total
HELD_CLASSES = (Klass.PACED.value, Klass.EXEMPT.value)  # the classes a configured host's requests take
ZERO_REASONS = ("max_wait", "queue_full")  # refusals worth a 0 line per configured host

disable_created_metrics()  # process-wide; the proxy's only registry is this module's


def code_class(status: int | None) -> str:
    return "error" if status is None else f"{status // 100}xx"


class _RateCollector(Collector):
    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "politeproxy_achieved_rate",
            f"Grants per second over the last {RATE_WINDOW:g} s (this process)",
            labels=["scope"],
        )
        now = self.m.clock()
        span = max(1e-9, min(RATE_WINDOW, now - self.m.started))
        g.add_metric(["global"], self.m.rate.count(now) / span)
        for host, window in self.m.host_rates.items():
            g.add_metric([host], window.count(now) / span)
        yield g


class Metrics(PacerEvents, ProxyEvents, CacheEvents):
    """Hears the events of the pacer, the proxy and the cache (``rejected`` serves the pacer and the proxy
    alike; the access line is ``logs.AccessLog``'s, so ``access`` stays the family's no-op and a fan-out
    leaves metrics out of it), and the composition root's few (``store_changed``, ``proxies_counted``,
    ``reloaded``, the gauges of ``observe/gauges.py``). Nothing else touches Prometheus."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, hosts: Iterable[str] = ()) -> None:
        self.clock = clock
        self.host_label = HostLabels()
        self.host_label.pin(hosts)
        # The label cap (issue 27): the configured pipelines and FREE_PIPELINES other names, first come; the
        # pacer gives far more names a fair share of their own, and those beyond the cap count as "other"
        # here only. The configured ones are named by configure_pipelines (start and reload).
        self.pipeline_label = PipelineNames(free=FREE_PIPELINES)
        self.started = clock()
        self.registry = CollectorRegistry()
        self._host_metrics(self.registry, self.host_label)
        self._interval_metric(self.registry, self.host_label)
        self._cache_metrics(self.registry)
        self._process_metrics(self.registry)
        self.build_info = Gauge(
            "politeproxy_build_info", "Always 1; the labels say what runs", ["version", "python"],
            registry=self.registry,
        )  # fmt: skip
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.rate = RateWindow()
        self.host_rates: dict[str, RateWindow] = {}  # by host label: bounded like the label
        # Per-host depth and in-flight counts of the names labelled "other", summed into its gauge; an
        # entry leaves when it reaches zero, so this holds only hosts with waiters or reads now.
        self._other_depth: dict[str, int] = {}
        self._other_exempt: dict[str, int] = {}
        # Depth per (host, pipeline) line whose labels are shared (``other``), summed into the gauge.
        self._other_lines: dict[tuple[str, str], int] = {}
        self.registry.register(_RateCollector(self))

    def _host_metrics(self, r: CollectorRegistry, lab: HostLabels) -> None:
        # The per-request families are updated in place (observe/inplace.py) and built at each scrape.
        pipe = self.pipeline_label.counted_as
        self.requests = CountTable(
            "politeproxy_requests", "Answered requests by upstream status class",
            ["host", "class", "code", "pipeline"], lab, pipe,
        )  # fmt: skip
        self.grants = CountTable("politeproxy_grants", "Slots granted", ["host", "pipeline"], lab, pipe)
        self.retries = HostLabelled(
            Counter("politeproxy_retries", "Throttled requests retried by the proxy", ["host"], registry=r),
            lab,
        )
        self.wait = HistogramTable(
            "politeproxy_wait_seconds", "Time held before going upstream",
            ["host", "class", "pipeline"], WAIT_BUCKETS, lab, pipe,
        )  # fmt: skip
        self.lateness = HistogramTable(
            "politeproxy_grant_lateness_seconds", "How late a grant was handed out after its slot",
            ["host"], LATENESS_BUCKETS, lab,
        )  # fmt: skip
        self.bytes = CountTable("politeproxy_bytes", "Body bytes relayed", ["direction"])
        # The two directions' cells, looked up once: bytes_relayed runs for every chunk.
        self._bytes = {d: self.bytes.labels(d) for d in ("client_to_upstream", "upstream_to_client")}
        r.register(InPlace([self.requests, self.grants, self.wait, self.lateness, self.bytes]))
        self._host_state_metrics(r, lab)

    def _host_state_metrics(self, r: CollectorRegistry, lab: HostLabels) -> None:
        """The schedule's side of each host: grant lateness, queue, throttles, backoff, refusals."""
        self.queue_depth = HostLabelled(
            Gauge("politeproxy_queue_depth", "Requests waiting now", ["host", "pipeline"], registry=r), lab
        )
        self.throttles = HostLabelled(
            Counter("politeproxy_throttles", "Throttle answers", ["host", "code"], registry=r), lab
        )
        self.backoff = HostLabelled(
            Gauge(
                "politeproxy_backoff_seconds",
                "Time until the host may be sent to again",
                ["host"],
                registry=r,
            ),
            lab,
        )
        self.rejections = HostLabelled(
            Counter("politeproxy_rejected", "Requests refused", ["host", "reason", "pipeline"], registry=r),
            lab,
        )
        self.exempt_in_flight = HostLabelled(
            Gauge("politeproxy_exempt_in_flight", "Exempt reads in flight", ["host"], registry=r), lab
        )

    def _interval_metric(self, r: CollectorRegistry, lab: HostLabels) -> None:
        # issue 12: the adaptive (AIMD) interval every proxy on the store applies to the host now
        self.host_interval = HostLabelled(
            Gauge(
                "politeproxy_host_interval_seconds",
                "The host's effective interval (raised by throttles, stepping back to the configured one)",
                ["host"],
                registry=r,
            ),
            lab,
        )

    def _cache_metrics(self, r: CollectorRegistry) -> None:
        # issue 14: the shared disk cache; the pipeline label is bounded like the others
        self.cache_requests = Counter(
            "politeproxy_cache_requests",
            "Requests to cacheable hosts by cache result (hit, miss, bypass, stale)",
            ["result", "pipeline"],
            registry=r,
        )
        self.cache_bytes = Gauge("politeproxy_cache_bytes", "Bytes in the shared disk cache", registry=r)
        self.cache_evictions = Counter(
            "politeproxy_cache_evictions", "Cache entries evicted to stay under cache.max_size", registry=r
        )
        self.cache_saved = Counter(
            "politeproxy_cache_slots_saved",
            "Requests answered by the cache that would have taken a slot or an exempt place",
            ["pipeline"],
            registry=r,
        )
        self.index_questions = Counter(  # issue 43
            "politeproxy_index_questions",
            "CDX questions about published crawls: answered from a kept answer, shared with another asker's"
            " question in flight, or asked of the index server",
            ["result", "pipeline"],
            registry=r,
        )

    # -- CacheEvents ------------------------------------------------------------------------------

    def cache_result(self, result: str, pipeline: str) -> None:
        if result in RESULTS:
            self.cache_requests.labels(result, self.pipeline_label.counted_as(pipeline)).inc()

    def index_question(self, result: str, pipeline: str) -> None:
        if result in INDEX_RESULTS:
            self.index_questions.labels(result, self.pipeline_label.counted_as(pipeline)).inc()

    def cache_slot_saved(self, pipeline: str) -> None:
        self.cache_saved.labels(self.pipeline_label.counted_as(pipeline)).inc()

    def cache_size(self, nbytes: int) -> None:
        self.cache_bytes.set(nbytes)

    def cache_evicted(self, n: int) -> None:
        self.cache_evictions.inc(n)

    def _process_metrics(self, r: CollectorRegistry) -> None:
        self.configured_rate = Gauge(
            "politeproxy_configured_rate", "The global budget in requests per second (0 when off)", registry=r
        )
        self.degraded = Gauge(
            "politeproxy_schedule_degraded",
            "1 while the shared store is down and pacing is local",
            registry=r,
        )
        self.store = Gauge("politeproxy_schedule_store", "1 for the store in use", ["store"], registry=r)
        # issue 27: the heartbeats' live count, and the gap multiplier the fallback would pace with
        self.proxies_live = Gauge(
            "politeproxy_proxies_live",
            "Proxies live on the shared store (heartbeats), this one included",
            registry=r,
        )
        self.fallback_multiplier = Gauge(
            "politeproxy_fallback_gap_multiplier",
            "The gap multiplier while the shared store is down: max(expected_proxies, live count last seen)",
            registry=r,
        )
        self.reloads = Counter(
            "politeproxy_config_reloads", "Config reloads by result", ["result"], registry=r
        )
        self.tunnels_open = Gauge("politeproxy_tunnels_open", "CONNECT tunnels open now", registry=r)
        # issue 24: each service's request window, as every proxy sharing the store (and egress) counts it
        self.window_requests = Gauge(
            "politeproxy_window_requests",
            "Requests in the service's trailing request window now (egress.window), every class and proxy",
            ["service"],
            registry=r,
        )
        self.window_limit = Gauge(
            "politeproxy_window_limit",
            "The service's request window limit (egress.limit)",
            ["service"],
            registry=r,
        )
        for result in ("ok", "error"):
            self.reloads.labels(result)

    def pin_hosts(self, hosts: Iterable[str]) -> None:
        """Hosts that always keep a label of their own (the configured concrete hosts)."""
        self.host_label.pin(hosts)

    def configure_pipelines(self, settings: PacingSettings) -> None:
        """The configured pipelines keep their labels whatever else comes (at most MAX_PIPELINES)."""
        self.pipeline_label.configure(r.name for r in settings.pipelines[:MAX_PIPELINES])

    def prepare(self, hosts: Iterable[str], settings: PacingSettings) -> None:
        """Create the label sets of the configured hosts at 0 (bounded by the config: hosts x classes x
        status groups x configured pipelines), so panels and ``rate()`` show 0 from the first scrape."""
        hosts = list(hosts)
        self.pin_hosts(hosts)
        self.configure_pipelines(settings)
        pipes = [DEFAULT_PIPELINE, *(r.name for r in settings.pipelines)]
        codes = [*map(str, sorted(settings.throttle_codes | settings.block_codes)), "error"]
        for rule in {r.service: r for h in hosts if (r := settings.window_for(h)) is not None}.values():
            self.window_requests.labels(rule.service)  # issue 24: the window's series from the first scrape
            self.window_limit.labels(rule.service).set(rule.limit)
        for h in hosts:
            for g in (self.retries, self.lateness, self.backoff, self.exempt_in_flight):
                g.labels(h)
            for code in codes:
                self.throttles.labels(h, code)
            for pipe in pipes:
                self.grants.labels(h, pipe)
                self.queue_depth.labels(h, pipe)
                for reason in ZERO_REASONS:
                    self.rejections.labels(h, reason, pipe)
                for klass in HELD_CLASSES:
                    self.wait.labels(h, klass, pipe)
                    for group in STATUS_GROUPS:
                        self.requests.labels(h, klass, group, pipe)

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = DEFAULT_PIPELINE) -> None:
        """One answered request; ``status`` None when the upstream failed."""
        self.requests.inc((host, klass, code_class(status), pipeline))

    # -- ProxyEvents (answered and rejected above and below serve both Protocols) -------------------

    def bytes_relayed(self, direction: str, n: int) -> None:
        cell = self._bytes.get(direction)
        if cell is not None:  # a direction nobody defined is not a new label
            cell[0] += n

    def tunnels_changed(self, open_now: int) -> None:
        self.tunnels_open.set(open_now)

    def retried(self, host: str) -> None:
        self.retries.labels(host).inc()

    def set_configured_gap(self, gap: float) -> None:
        self.configured_rate.set(1.0 / gap if gap > 0 else 0.0)

    def set_store(self, name: str, degraded: bool) -> None:
        """The store paced on now (``name``, one of ``stores.base.BACKENDS``), and whether that is the
        fallback of a shared store that does not answer."""
        for s in BACKENDS:
            self.store.labels(s).set(1 if s == name else 0)
        self.degraded.set(1 if degraded else 0)

    def proxies_counted(self, live: int, multiplier: float) -> None:
        """The heartbeats' live count, and the gap multiplier the fallback would pace with."""
        self.proxies_live.set(live)
        self.fallback_multiplier.set(multiplier)

    def reloaded(self, ok: bool) -> None:
        """One config reload, taken or rejected."""
        self.reloads.labels("ok" if ok else "error").inc()

    def host_gauges(self, host: str, backoff: float, interval: float) -> None:
        """A host's backoff left and effective interval, as last read from the store."""
        self.backoff.labels(host).set(backoff)
        self.host_interval.labels(host).set(interval)

    def window_gauges(self, service: str, requests: int, limit: int) -> None:
        """A service's request window: the requests in it now and its limit."""
        self.window_requests.labels(service).set(requests)
        self.window_limit.labels(service).set(limit)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- PacerEvents ------------------------------------------------------------------------------

    def granted(self, host: str, lateness: float, pipeline: str) -> None:
        self.grants.inc((host, pipeline))
        self.lateness.observe((host,), lateness)
        now = self.clock()
        self.rate.add(now)
        label = self.host_label(host)
        window = self.host_rates.get(label)
        if window is None:  # no new RateWindow per grant (setdefault would build one each time)
            window = self.host_rates[label] = RateWindow()
        window.add(now)

    def waited(self, host: str, klass: Klass, seconds: float, pipeline: str) -> None:
        self.wait.observe((host, klass.value, pipeline), seconds)

    def throttled(self, host: str, code: int, delay: float) -> None:
        self.throttles.labels(host, str(code) if code else "error").inc()

    def rejected(self, host: str, reason: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        self.rejections.labels(host, reason, self.pipeline_label.counted_as(pipeline)).inc()

    def line_changed(self, host: str, pipeline: str, depth: int) -> None:
        """The depth of one (host, pipeline) line; lines that share a label (``other``) are summed. A
        host's depth is their sum (``sum by (host) (politeproxy_queue_depth)``)."""
        labels = (self.host_label(host), self.pipeline_label.counted_as(pipeline))
        if labels == (host, pipeline) and OTHER not in labels:
            self.queue_depth.metric.labels(*labels).set(depth)
            return
        if depth:
            self._other_lines[(host, pipeline)] = depth
        else:
            self._other_lines.pop((host, pipeline), None)
        total = sum(
            n
            for (h, p), n in self._other_lines.items()
            if (self.host_label(h), self.pipeline_label.counted_as(p)) == labels
        )
        self.queue_depth.metric.labels(*labels).set(total)

    def exempt_changed(self, host: str, in_flight: int) -> None:
        label = self.host_label(host)
        self.exempt_in_flight.labels(host).set(summed(label, host, in_flight, self._other_exempt))
