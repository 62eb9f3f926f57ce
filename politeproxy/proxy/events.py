"""What the proxy layer reports, and to whom: a small Protocol instead of Prometheus objects.

``metrics.Metrics`` counts these events and ``logs.AccessLog`` writes the access line; ``app.py`` joins
the two with ``Tee``. The proxy layer knows neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class AccessRecord:
    """One exchange as the access log shows it, built once by the forwarder (rendered by logs.py)."""

    client: str
    method: str
    host: str
    klass: str
    wait: float
    status: int
    bytes: int
    duration: float
    note: str | None = None
    pipeline: str | None = None  # who asked (bounded name), None when no pipeline was named yet


class ProxyEvents(Protocol):
    """What the proxy layer reports. ``direction`` is "client_to_upstream" or "upstream_to_client"."""

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None: ...
    def rejected(self, host: str, reason: str) -> None: ...
    def bytes_relayed(self, direction: str, n: int) -> None: ...
    def tunnels_changed(self, open_now: int) -> None: ...
    def retried(self, host: str) -> None: ...
    def access(self, record: AccessRecord) -> None: ...


class NoProxyEvents:
    """ProxyEvents that go nowhere: the base of a sink that hears only some events, and tests."""

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None:
        pass

    def rejected(self, host: str, reason: str) -> None:
        pass

    def bytes_relayed(self, direction: str, n: int) -> None:
        pass

    def tunnels_changed(self, open_now: int) -> None:
        pass

    def retried(self, host: str) -> None:
        pass

    def access(self, record: AccessRecord) -> None:
        pass


class Tee:
    """ProxyEvents handed to every sink in turn (metrics, then the access log)."""

    def __init__(self, *sinks: ProxyEvents) -> None:
        self.sinks = sinks

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None:
        for s in self.sinks:
            s.answered(host, klass, status, pipeline)

    def rejected(self, host: str, reason: str) -> None:
        for s in self.sinks:
            s.rejected(host, reason)

    def bytes_relayed(self, direction: str, n: int) -> None:
        for s in self.sinks:
            s.bytes_relayed(direction, n)

    def tunnels_changed(self, open_now: int) -> None:
        for s in self.sinks:
            s.tunnels_changed(open_now)

    def retried(self, host: str) -> None:
        for s in self.sinks:
            s.retried(host)

    def access(self, record: AccessRecord) -> None:
        for s in self.sinks:
            s.access(record)
