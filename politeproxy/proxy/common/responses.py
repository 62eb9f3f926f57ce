"""The refusal a connection ends with (a whole close-delimited answer, written before or instead of any
request's) and the rate-limited log of refusals.

Every answer written here carries ``Via: 1.1 politeproxy`` (``passage``): a tool can tell the proxy's
own refusal from the upstream's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from politeproxy.policy.answers import error_type, proxy_status
from politeproxy.policy.loglimit import LogLimiter
from politeproxy.proxy.common.passage import VIA_ENTRY


def plain_response(status: int, reason: str, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A complete error answer, after which the connection closes (front.py, h1server.py, peek.py)."""
    body = f"politeproxy: {message}\n".encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        f"Via: {VIA_ENTRY}",
        f"Proxy-Status: {proxy_status(error_type(status), message)}",
    ]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class BurstLimitedLog:
    """A per-key burst limiter for log lines (a key is a client or a host): at most ``burst`` lines per
    key in ``window`` seconds; the rest are counted and summed up in one line when that key's next window
    opens. Remembers at most ``max_keys`` keys. The counting is the one log limiter's (``policy.loglimit``).

    Lines go to the ``events`` child of the given logger (``politeproxy.events`` for the proxy's own),
    which ``logs.setup_logging`` keeps at INFO: refusals show at the default level, without ``-v``.
    """

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        burst: int = 5,
        window: float = 10.0,
        max_keys: int = 1024,
    ) -> None:
        self.logger = logger if logger.name.endswith(".events") else logger.getChild("events")
        self.clock = clock
        self.limiter = LogLimiter(burst, window, max_keys)

    def allow(self, key: str) -> bool:
        """Count one event for ``key``; True when it may be logged."""
        v = self.limiter.hit(key, self.clock())
        if v.held:
            self.logger.info("%s: %d more refusals not logged (rate-limited)", key, v.held)
        return v.log

    def info(self, key: str, msg: str, *args: object) -> None:
        if self.allow(key):
            self.logger.info(msg, *args)

    def warning(self, key: str, msg: str, *args: object) -> None:
        if self.allow(key):
            self.logger.warning(msg, *args)
