"""Prometheus metrics. Counters and histograms are the truth; the achieved-rate gauge is for a glance."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from politeproxy.pacing.pacer import PacerEvents
from politeproxy.policy.classify import Klass

# The achieved-rate gauge's window; POLITEPROXY_RATE_WINDOW shortens it (tests, quick dashboards).
RATE_WINDOW = float(os.environ.get("POLITEPROXY_RATE_WINDOW", "60") or 60)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60)
OTHER = "other"  # the host label of every non-paced host: bounded cardinality


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
        self.m.prune(now)
        g.add_metric(["global"], len(self.m.grant_times) / span)
        for host, times in self.m.host_grant_times.items():
            g.add_metric([host], len(times) / span)
        yield g


class Metrics(PacerEvents):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "politeproxy_requests",
            "Answered requests by upstream status class",
            ["host", "class", "code"],
            registry=r,
        )
        self.grants = Counter("politeproxy_grants", "Slots granted", ["host"], registry=r)
        self.retries = Counter(
            "politeproxy_retries", "Throttled requests retried by the proxy", ["host"], registry=r
        )
        self.wait = Histogram(
            "politeproxy_wait_seconds",
            "Time held before going upstream",
            ["host", "class"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.lateness = Histogram(
            "politeproxy_grant_lateness_seconds",
            "How late a grant was handed out after its slot",
            ["host"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )
        self.queue_depth = Gauge("politeproxy_queue_depth", "Requests waiting now", ["host"], registry=r)
        self.configured_rate = Gauge(
            "politeproxy_configured_rate", "The global budget in requests per second (0 when off)", registry=r
        )
        self.throttles = Counter("politeproxy_throttles", "Throttle answers", ["host", "code"], registry=r)
        self.backoff = Gauge(
            "politeproxy_backoff_seconds", "Time until the host may be sent to again", ["host"], registry=r
        )
        self.rejections = Counter("politeproxy_rejected", "Requests refused", ["host", "reason"], registry=r)
        self.exempt_in_flight = Gauge(
            "politeproxy_exempt_in_flight", "Exempt reads in flight", ["host"], registry=r
        )
        self.bytes = Counter("politeproxy_bytes", "Body bytes relayed", ["direction"], registry=r)
        self.degraded = Gauge(
            "politeproxy_schedule_degraded",
            "1 while the shared store is down and pacing is local",
            registry=r,
        )
        self.store = Gauge("politeproxy_schedule_store", "1 for the store in use", ["store"], registry=r)
        self.reloads = Counter(
            "politeproxy_config_reloads", "Config reloads by result", ["result"], registry=r
        )
        self.tunnels_open = Gauge("politeproxy_tunnels_open", "CONNECT tunnels open now", registry=r)
        self.grant_times: deque[float] = deque()
        self.host_grant_times: dict[str, deque[float]] = {}
        r.register(_RateCollector(self))
        for direction in ("client_to_upstream", "upstream_to_client"):
            self.bytes.labels(direction)
        for result in ("ok", "error"):
            self.reloads.labels(result)

    def prune(self, now: float) -> None:
        cutoff = now - RATE_WINDOW
        while self.grant_times and self.grant_times[0] < cutoff:
            self.grant_times.popleft()
        for times in self.host_grant_times.values():
            while times and times[0] < cutoff:
                times.popleft()

    def answered(self, host: str, klass: str, status: int | None) -> None:
        """One answered request; ``status`` None when the upstream failed."""
        self.requests.labels(host, klass, code_class(status)).inc()

    def set_configured_gap(self, gap: float) -> None:
        self.configured_rate.set(1.0 / gap if gap > 0 else 0.0)

    def set_store(self, name: str, degraded: bool) -> None:
        for s in ("memory", "file", "redis"):
            self.store.labels(s).set(1 if s == name else 0)
        self.degraded.set(1 if degraded else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- PacerEvents ------------------------------------------------------------------------------

    def granted(self, host: str, lateness: float) -> None:
        self.grants.labels(host).inc()
        self.lateness.labels(host).observe(lateness)
        now = self.clock()
        self.grant_times.append(now)
        self.host_grant_times.setdefault(host, deque()).append(now)

    def waited(self, host: str, klass: Klass, seconds: float) -> None:
        self.wait.labels(host, klass.value).observe(seconds)

    def throttled(self, host: str, code: int, delay: float) -> None:
        self.throttles.labels(host, str(code) if code else "error").inc()

    def rejected(self, host: str, reason: str) -> None:
        self.rejections.labels(host, reason).inc()

    def queue_changed(self, host: str, depth: int) -> None:
        self.queue_depth.labels(host).set(depth)

    def exempt_changed(self, host: str, in_flight: int) -> None:
        self.exempt_in_flight.labels(host).set(in_flight)
