"""Throttle a host on the fake upstream and read that host's arrivals (the backoff tests)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.support.upstream_proc import Upstream


def throttle(
    up: Upstream,
    host: str,
    count: int,
    retry_after: str | None,
    status: int = 503,
    headers: Mapping[str, str] | None = None,
    body: str | None = None,
) -> None:
    """The next ``count`` requests to ``host`` get ``status`` (with ``headers`` and ``body`` when given:
    Server: AmazonS3 and an XML error, say), then the host answers as usual."""
    t: dict[str, Any] = {"host": host, "count": count, "status": status, "retry_after": retry_after}
    if headers is not None:
        t["headers"] = dict(headers)
    if body is not None:
        t["body"] = body
    up.control({"throttle": t})


def arrivals(up: Upstream, host: str) -> list[dict[str, Any]]:
    return sorted(
        (a for a in up.log() if a["host"] == host and a["path"] != "/robots.txt"), key=lambda a: a["t"]
    )
