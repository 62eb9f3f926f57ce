"""What the proxy layer reports, and to whom: a small Protocol instead of Prometheus objects.

``metrics.Metrics`` counts these events and ``logs.AccessLog`` writes the access line; ``app.py`` joins
the two with ``Tee``. The proxy layer knows neither.
"""

from __future__ import annotations

import re
from typing import Protocol

from politeproxy.proxy.exchange import Exchange

PATH_LIMIT = 120  # characters of the path an access line keeps
_RAW_LIMIT = 4 * PATH_LIMIT  # what is looked at at all: a path can be 8 KiB
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")


def access_path(raw: str, limit: int = PATH_LIMIT) -> str:
    """A request target for a log line: the path only, a query shown as ``?...`` (presigned URLs carry
    their signature there, under names no list can foresee), every byte outside printable ASCII
    percent-encoded (no control character, space or newline reaches a log), cut to ``limit`` characters
    with a trailing "..." when longer. Never raises."""
    path, mark, _query = raw[:_RAW_LIMIT].partition("?")
    text = path + ("?..." if mark else "")
    text = _UNPRINTABLE.sub(
        lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), text
    )
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


class ProxyEvents(Protocol):
    """What the proxy layer reports. ``direction`` is "client_to_upstream" or "upstream_to_client"."""

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None: ...
    def rejected(self, host: str, reason: str) -> None: ...
    def bytes_relayed(self, direction: str, n: int) -> None: ...
    def tunnels_changed(self, open_now: int) -> None: ...
    def retried(self, host: str) -> None: ...
    def access(self, record: Exchange) -> None: ...


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

    def access(self, record: Exchange) -> None:
        pass


_EVENTS = ("answered", "rejected", "bytes_relayed", "tunnels_changed", "retried", "access")


class Tee:
    """ProxyEvents handed to every sink in turn (metrics, then the access log). Per event, a sink whose
    method is ``NoProxyEvents``'s empty one is left out, and when one sink is left its method is bound
    here directly: the per-request events then cost one call each."""

    def __init__(self, *sinks: ProxyEvents) -> None:
        self.sinks = sinks
        for name in _EVENTS:
            empty = getattr(NoProxyEvents, name)
            live = [getattr(s, name) for s in sinks if getattr(type(s), name, None) is not empty]
            if len(live) == 1:
                setattr(self, name, live[0])
            elif not live:
                setattr(self, name, getattr(NoProxyEvents(), name))

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

    def access(self, record: Exchange) -> None:
        for s in self.sinks:
            s.access(record)
