"""Answers the proxy writes itself: plain error heads before aiohttp, error answers, the 431 of
a head over max_header_size (aiohttp's server bounded here), and the rate-limited log of refusals.

Every answer written here carries ``Via: 1.1 politeproxy`` (``passage``): a tool can tell the proxy's
own refusal from the upstream's."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Unpack

from aiohttp import StreamReader, web

from politeproxy.policy.answers import error_type, proxy_status
from politeproxy.policy.loglimit import LogLimiter
from politeproxy.policy.routing import Refusal
from politeproxy.proxy.aiohttp_seams import (
    HandlerSeam,
    HandlerSettings,
    HttpProcessingError,
    RequestHandler,
    ServerOptions,
    ServerSeam,
)
from politeproxy.proxy.passage import VIA_ENTRY, add_via


def plain_response(status: int, reason: str, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A complete close-delimited error answer, for the front protocol before aiohttp takes over."""
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


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, text=f"politeproxy: {message}\n", headers=headers)
    add_via(resp.headers)
    if "Proxy-Status" not in resp.headers:
        resp.headers["Proxy-Status"] = proxy_status(error_type(status), message)
    return resp


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


class BadRequestOneLine(logging.Filter):
    """aiohttp logs a client's malformed request with a traceback at ERROR; make it one INFO line,
    rate-limited per client. Anything else (a real bug in a handler) keeps its traceback.
    """

    def __init__(self, repeats: BurstLimitedLog) -> None:
        super().__init__()
        self.repeats = repeats

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            first = (exc.message or type(exc).__name__).strip().splitlines()[0][:200]
            record.msg, record.args = "%s: %d malformed request: %s", (remote, exc.code or 400, first)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            return self.repeats.allow(str(remote))
        return True


def head_size(request: web.BaseRequest) -> int:
    """The size of a parsed request head as it came on the wire (give or take optional spaces)."""
    line = len(request.method) + len(request.raw_path) + 12  # " ", " HTTP/1.1", CRLF
    return line + sum(len(k) + len(v) + 4 for k, v in request.raw_headers) + 2


Report = Callable[[str, Refusal], None]  # log and count a refusal of this client


class BoundedHandler(HandlerSeam):
    """aiohttp bounds each header line, not a head: count the bytes of the head being read.

    While no request body is being read, every byte that arrives belongs to a head. When those bytes
    pass the limit before a head is complete, the connection gets 431 and is closed. A head that
    completes in one read is checked whole before the request handler runs (``head_size``). So a
    connection holds at most the limit plus one read of head bytes, and no head over it goes upstream.
    (aiohttp's internal state, read through aiohttp_seams.HandlerSeam; tests/test_front_limits.py pins it.)
    """

    # aiohttp's RequestHandler has __slots__: without ours every connection would carry a __dict__ too
    # (one handler per plain connection; issue 15, memory per held request).
    __slots__ = ("_head_limit", "_head_bytes", "_report", "_last_payload")

    def __init__(
        self, manager: web.Server, *, head_limit: int, report: Report, **kw: Unpack[HandlerSettings]
    ) -> None:
        super().__init__(manager, **kw)
        self._head_limit = head_limit
        self._head_bytes = 0
        self._report = report
        self._last_payload: StreamReader | None = None

    def data_received(self, data: bytes) -> None:
        if self.heads_over():
            return super().data_received(data)
        in_head = self._last_payload is None or self._last_payload.is_eof()
        before = self.heads_parsed()
        super().data_received(data)
        if self.heads_parsed() != before:
            self._head_bytes = 0  # a head completed: what follows in this read is body or the next head
            self._last_payload = self.newest_payload()
        elif in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self._head_limit:
                self._refuse()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse, with our Via like every answer we write."""
        resp = super().handle_error(request, status, exc, message)
        add_via(resp.headers)
        return resp

    def _refuse(self) -> None:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        message = f"request head over max_header_size {self._head_limit}"
        self._report(str(peer[0]) if peer else "?", Refusal(431, message, "bad_request"))
        if self.transport is not None and not self.answering():
            self.transport.write(plain_response(431, "Request Header Fields Too Large", message))
        self.force_close()


class BoundedServer(ServerSeam):
    """aiohttp's low-level server with bounded heads, telling us when one of its connections ends."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        on_lost: Callable[[RequestHandler], None],
        head_limit: int,
        report: Report,
        **kwargs: Unpack[ServerOptions],
    ) -> None:
        super().__init__(self._bounded, **kwargs)
        self._inner = handler
        self._on_lost = on_lost
        self._head_limit = head_limit
        self._report = report

    async def _bounded(self, request: web.BaseRequest) -> web.StreamResponse:
        size, limit = head_size(request), self._head_limit
        if size <= limit:
            return await self._inner(request)
        message = f"request head of {size} bytes is over max_header_size {limit}"
        self._report(request.remote or "?", Refusal(431, message, "bad_request"))
        resp = error_response(431, message)
        resp.force_close()
        return resp

    def __call__(self) -> RequestHandler:
        # aiohttp's protocol factory: one handler per connection (aiohttp_seams, internal 2)
        return BoundedHandler(
            self, head_limit=self._head_limit, report=self._report, **self.handler_settings()
        )

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._on_lost(handler)
