"""The intercepted connection on the project's own protocol: HTTP/1.1 over httptools (llhttp) inside a TLS
tunnel, the floor probe's shape (bench/floor_server.py) with every behaviour of the proxy.

One ``H1Server`` per intercepted tunnel, made with its ``Tunnel`` (so the pipeline travels by parameter to
the forwarder). The parser reads heads and bodies; each complete head becomes a ``Served`` (the request and
the way back to its client, a ``clientside.ClientSide``), queued in order. One task at a time answers the
queue through ``serve`` (``Forwarder.tunneled``), so pipelined requests are answered in order; it exists
only while a request is queued or answered, and a client that leaves cancels it (its place in a host's
line is freed). Bounds: a head over ``max_header_size`` gets 431 (counted while it arrives, across
reads), a malformed one 400, both once every earlier request is answered, then the connection closes;
request body bytes are buffered up to BODY_HIGH and reading pauses meanwhile, as it does when MAX_QUEUED
requests wait; writes wait while the client reads slowly (``pause_writing``). Timers: ``header`` for a head
begun, ``idle`` between requests and for a request body that stalls.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import httptools
from multidict import CIMultiDict

from politeproxy.policy.routing import Refusal
from politeproxy.proxy.clientside import ClientGone, own
from politeproxy.proxy.exchange import Tunnel
from politeproxy.proxy.responses import BurstLimitedLog, plain_response
from politeproxy.proxy.served import Served

log = logging.getLogger("politeproxy")
malformed = BurstLimitedLog(log)  # a client's malformed requests: one line each, rate-limited per client
MAX_QUEUED = 16  # pipelined requests read ahead of the one answered; more pause reading
BODY_HIGH = 256 * 1024  # request body bytes buffered before reading pauses (resumes under BODY_LOW)
BODY_LOW = 64 * 1024
LINGER = 2.0  # seconds an unread request body is read and dropped after its answer, then the close
LINE_EXTRA = 12  # a request line's bytes besides its method and target: " ", " HTTP/1.1", CRLF


class Limits(Protocol):
    """The bounds of a served connection (listener.Timeouts)."""

    @property
    def header(self) -> float: ...
    @property
    def idle(self) -> float: ...
    @property
    def max_header_size(self) -> int: ...


Serve = Callable[[Served, Tunnel], Awaitable[None]]
Report = Callable[[str, Refusal], None]  # log and count a refusal of this client
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class _TooBig(Exception):
    """Raised from a parser callback: the head passed max_header_size."""


class _Malformed(Exception):
    """Raised from a parser callback: a head llhttp accepts and HTTP/1.1 does not (RFC 9112 3.2)."""


class _Stop:
    """Queued after the last good request: the answer the connection ends with (400 or 431)."""

    __slots__ = ("status", "reason", "message")

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message


class H1Server(asyncio.Protocol):
    """One intercepted client connection, read by httptools, answered through ``serve`` in order."""

    __slots__ = (
        "tunnel", "serve", "limits", "report", "spawn", "on_lost", "transport", "parser", "queue",
        "task", "reading", "in_body", "url", "headers", "head_bytes", "raw_head", "heads", "stopped",
        "paused", "write_paused", "drain_waiter", "timer", "lost",
    )  # fmt: skip

    def __init__(
        self,
        tunnel: Tunnel,
        serve: Serve,
        limits: Limits,
        report: Report,
        spawn: Spawn,
        on_lost: Callable[[H1Server], None],
    ) -> None:
        self.tunnel, self.serve, self.limits, self.report = tunnel, serve, limits, report
        self.spawn, self.on_lost = spawn, on_lost
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Served | _Stop] = deque()
        self.task: asyncio.Task[None] | None = None
        self.reading: Served | None = None  # the request whose body is being parsed
        self.in_body = False
        self.url: list[bytes] = []
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.head_bytes = 0  # of the head being parsed, counted from its parts
        self.raw_head = 0  # bytes of reads in which no head completed: the bound across reads
        self.heads = 0
        self.stopped = False  # no further request is read (a refusal is queued, or the client upgraded)
        self.paused = False
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.lost = False

    # -- the transport's calls ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (asyncio's or aiofastnet's)
        self._timer(self.limits.idle)

    def data_received(self, data: bytes) -> None:
        if self.stopped or self.lost:
            return
        in_head, before = not self.in_body, self.heads
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.stopped = True  # an Upgrade (or CONNECT) inside the tunnel: answered, then the close
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, _Malformed):
                self._malformed(str(e.__context__))
            elif isinstance(e.__context__, _TooBig):
                self._too_big()
            else:
                raise
            return
        except httptools.HttpParserError as e:
            self._malformed(str(e) or type(e).__name__)
            return
        if self.heads != before:
            self.raw_head = 0
        elif in_head:
            self.raw_head += len(data)
            if self.raw_head > self.limits.max_header_size:
                self._too_big()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: connection_lost cancels what is answered, as aiohttp did

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._timer(0)
        for r in [self.reading, *self.queue]:
            if isinstance(r, Served):
                r.broke("the client connection closed")
        self.queue.clear()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_exception(ClientGone("the client connection closed"))
        if self.task is not None:
            self.task.cancel()  # the client left: its exchange stops and frees its place in line
        self.on_lost(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self.lost:
            raise ClientGone("the client connection closed")
        if not self.write_paused:
            return
        loop = asyncio.get_running_loop()
        self.drain_waiter = loop.create_future()
        await self.drain_waiter

    # -- the parser's calls -----------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url, self.headers, self.head_bytes = [], CIMultiDict(), 0
        if self.task is None and not self.queue:
            self._timer(self.limits.header)  # a head begun on an idle connection must complete in time

    def on_url(self, url: bytes) -> None:
        self.url.append(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        self._count(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        p = self.parser
        method = p.get_method().decode("ascii", "replace")
        self._count(len(method) + LINE_EXTRA + 2)
        self.heads += 1
        self.in_body = True
        major, _, minor = p.get_http_version().partition(".")
        hosts = len(self.headers.getall("Host", ()))
        if hosts > 1 or hosts == 0 and (major, minor) >= ("1", "1"):
            raise _Malformed("a request head needs exactly one Host field")
        req = Served(
            self,
            method,
            b"".join(self.url).decode("utf-8", "surrogateescape"),
            (int(major or 1), int(minor or 1)),
            self.tunnel.client,
            self.headers,
            p.should_keep_alive(),
        )
        self.reading = req
        self.queue.append(req)
        if self.task is None:
            self._timer(0)
            self.task = self.spawn(self._run())
        self.flow()

    def on_body(self, body: bytes) -> None:
        if self.reading is not None:
            self.reading.fed(body)
            self.flow()

    def on_message_complete(self) -> None:
        self.in_body = False
        if self.reading is not None:
            self.reading.completed()
            self.reading = None
        self.flow()
        if self.task is None and not self.queue:  # a dropped body ended: idle again
            self._timer(self.limits.idle)

    # -- answering, in order --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self.queue and not self.lost:
                req = self.queue.popleft()
                self.flow()
                if isinstance(req, _Stop):
                    self._write_stop(req)
                    return
                await self._answer(req)
                if not self._carry_on(req):
                    return
        finally:
            self.task = None
        if not self.lost and not self.in_body and not self.stopped:
            self._timer(self.limits.idle)

    async def _answer(self, req: Served) -> None:
        try:
            await self.serve(req, self.tunnel)
        except ConnectionError:
            req.abort()
        except Exception:  # noqa: BLE001 - a bug in one exchange must not end the listener
            log.exception("%s: %s %s failed", req.remote, req.method, req.target[:200])
            if req.head_sent:
                req.abort()
            else:
                o = own(500, "internal error")
                o.close = True
                await req.answer(o)

    def _carry_on(self, req: Served) -> bool:
        """After an answer: whether the connection serves the next request."""
        t = self.transport
        if t is None or t.is_closing() or self.lost:
            return False
        if not req.ended:
            t.abort()  # an answer that did not end whole: a cut, never a short body presented as whole
            return False
        if req.close or not req.keep_alive or self.stopped and not self.queue:
            t.close()
            return False
        if not req.complete:  # its body was not read whole
            if req.expect and not req.continued:
                t.close()  # the client holds its body back for a 100 that never came
                return False
            req.discard()  # read and dropped, for LINGER seconds at most
            self._timer(LINGER, self._linger_over)
            self.flow()
        return True

    def _linger_over(self) -> None:
        if self.in_body and self.transport is not None:
            self.transport.close()

    # -- bounds and refusals --------------------------------------------------------------------------

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > self.limits.max_header_size:
            raise _TooBig

    def _too_big(self) -> None:
        message = f"request head over max_header_size {self.limits.max_header_size}"
        self.report(self.tunnel.client, Refusal(431, message, "bad_request"))
        self._stop(_Stop(431, "Request Header Fields Too Large", message))

    def _malformed(self, why: str) -> None:
        client = self.tunnel.client
        malformed.info(client, "%s: 400 malformed request: %s", client, why[:200])
        self._stop(_Stop(400, "Bad Request", f"malformed request: {why[:200]}"))

    def _stop(self, stop: _Stop) -> None:
        """No more reading: ``stop`` is answered once every request before it is."""
        self.stopped = True
        if self.reading is not None:
            self.reading.broke("the request ended in a malformed or oversized head")
        self.queue.append(stop)
        self.flow()
        if self.task is None:
            self._timer(0)
            self.task = self.spawn(self._run())

    def _write_stop(self, stop: _Stop) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(plain_response(stop.status, stop.reason, stop.message))
            self.transport.close()

    def flow(self) -> None:
        """Pause reading while MAX_QUEUED requests wait or a body's buffer is full; resume below."""
        r = self.reading
        full = r is not None and r.buffered >= (BODY_LOW if self.paused else BODY_HIGH)
        want = self.stopped or len(self.queue) >= MAX_QUEUED or full
        t = self.transport
        if t is None or want == self.paused or self.lost:
            return
        self.paused = want
        if want:
            t.pause_reading()
        else:
            t.resume_reading()

    def _timer(self, seconds: float, then: Callable[[], None] | None = None) -> None:
        """Replace the connection's one timer; 0 (or a bound of 0: none configured) cancels it."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if seconds > 0 and not self.lost:
            self.timer = asyncio.get_running_loop().call_later(seconds, then or self._expired)

    def _expired(self) -> None:
        """Idle between requests, or a head begun and not completed in time: the connection closes."""
        self.timer = None
        if self.task is None and self.transport is not None and not self.transport.is_closing():
            self.transport.close()
