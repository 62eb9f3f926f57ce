"""Answers the proxy writes itself: plain error heads before aiohttp, and the admin documents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web


def plain_response(status: int, reason: str, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A complete close-delimited error answer, for the front protocol before aiohttp takes over."""
    body = f"politeproxy: {message}\n".encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=f"politeproxy: {message}\n", headers=headers)


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def metrics_response(metrics: Any) -> web.Response:
    """/metrics, on the proxy port and on --metrics-listen."""
    return web.Response(
        body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def health_response(health: Callable[[], dict[str, Any]]) -> web.Response:
    """/healthz, on the proxy port and on --metrics-listen."""
    return web.json_response({"status": "ok", **health()})
