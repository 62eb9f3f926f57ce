"""What the proxy layer reports, and to whom: a small family of events instead of Prometheus objects.

``metrics.Metrics`` counts these events and ``logs.AccessLog`` writes the access line; ``app.py`` joins
the two with ``observe.fanout.fan_out``. The proxy layer knows neither.
"""

from __future__ import annotations

import re

from politeproxy.proxy.common.exchange import Exchange

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


class ProxyEvents:
    """What the proxy layer reports, each event declared once, here: a method that does nothing.

    This class is also the sink that goes nowhere (tests, tools). A sink subclasses it and overrides the
    events it hears (``metrics.Metrics``, ``logs.AccessLog``); ``observe/fanout.py`` hands each event to
    every sink that overrides it, so a new event is one method here plus the sinks that want it."""

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None:
        """One exchange answered (``status`` None: the upstream failed), counted as ``pipeline``."""

    def rejected(self, host: str, reason: str) -> None:
        """A request refused by the proxy itself; ``reason`` is the rejection counter's label."""

    def bytes_relayed(self, direction: str, n: int) -> None:
        """Body bytes relayed; ``direction`` is "client_to_upstream" or "upstream_to_client"."""

    def tunnels_changed(self, open_now: int) -> None:
        """The CONNECT tunnels open now."""

    def retried(self, host: str) -> None:
        """A throttled request retried by the proxy for its client."""

    def access(self, record: Exchange) -> None:
        """One exchange done: the access line's record."""


NoProxyEvents = ProxyEvents  # the family's own no-op methods: the sink that hears nothing
