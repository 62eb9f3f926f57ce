"""Throttle a host on the fake upstream and read that host's arrivals (the backoff tests)."""

from __future__ import annotations

from typing import Any

from tests.support.upstream_proc import Upstream


def throttle(up: Upstream, host: str, count: int, retry_after: str | None, status: int = 503) -> None:
    up.control({"throttle": {"host": host, "count": count, "status": status, "retry_after": retry_after}})


def arrivals(up: Upstream, host: str) -> list[dict[str, Any]]:
    return sorted(
        (a for a in up.log() if a["host"] == host and a["path"] != "/robots.txt"), key=lambda a: a["t"]
    )
