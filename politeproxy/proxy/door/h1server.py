"""The project's one HTTP/1.1 server protocol, over httptools (llhttp): it reads every client byte, the floor
probe's shape (bench/floor_server.py) with every behaviour of the proxy. ``H1Connection`` is the protocol;
two kinds of connection are made of it: ``front.FrontProtocol`` (the proxy port: a CONNECT, plain
``http://`` requests and the admin paths) and ``H1Server`` (an intercepted tunnel, made with its ``Tunnel``,
so the pipeline travels by parameter to the forwarder). The framing rules are framing.py's.

The parser reads heads and bodies; each complete head becomes a ``Served`` (the request and
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
from collections.abc import Awaitable, Callable, Coroutine
from http import HTTPStatus
from typing import Any, Protocol

import httptools
from multidict import CIMultiDict

from politeproxy.policy.routing import Refusal
from politeproxy.proxy.common.clientside import ClientGone, own
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.common.responses import BurstLimitedLog, plain_response
from politeproxy.proxy.door import framing
from politeproxy.proxy.door.deadline import Deadline
from politeproxy.proxy.door.framing import FIELD_EXTRA, LINE_EXTRA, OWS
from politeproxy.proxy.door.served import Served

log = logging.getLogger("politeproxy")
malformed = BurstLimitedLog(log)  # a client's malformed requests: one line each, rate-limited per client
MAX_QUEUED = 16  # pipelined requests read ahead of the one answered; more pause reading
BODY_HIGH = 256 * 1024  # request body bytes buffered before reading pauses (resumes under BODY_LOW)
BODY_LOW = 64 * 1024
LINGER = 2.0  # seconds an unread request body is read and dropped after its answer, then the close


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
    """Raised from a parser callback: a head llhttp accepts and framing.py does not: (status, why)."""


class _Stop:
    """Queued after the last good request: the answer the connection ends with (400 or 431)."""

    __slots__ = ("status", "reason", "message")

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message


class H1Connection(asyncio.Protocol):
    """One client connection, read by httptools and answered through ``_serve`` in order (a subclass's)."""

    __slots__ = (
        "client", "limits", "report", "spawn", "transport", "parser", "queue", "task", "reading",
        "in_body", "url", "headers", "head_bytes", "raw_head", "heads", "stopped", "paused",
        "write_paused", "drain_waiter", "bound", "lost",
    )  # fmt: skip

    def __init__(self, client: str, limits: Limits, report: Report, spawn: Spawn) -> None:
        self.client, self.limits, self.report, self.spawn = client, limits, report, spawn
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        # a list, not a deque: an empty deque holds a 528-byte block (per held connection); this one is short
        self.queue: list[Served | _Stop] = []
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
        self.bound = Deadline(self._expired)  # the head's, idle or linger: one at a time
        self.lost = False

    def _serve(self, req: Served) -> Awaitable[None]:
        """The answer to one request: the forwarder's entry for this kind of connection, called, not
        wrapped in a coroutine of its own (one frame less per request)."""
        raise NotImplementedError

    def _upgraded(self, rest: bytes) -> None:
        """llhttp stopped at a CONNECT or an Upgrade head; ``rest``: the bytes read after it. Inside a
        tunnel it is answered like any request, then the connection closes."""
        self.stopped = True

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
        except httptools.HttpParserUpgrade as e:
            self._upgraded(data[e.args[0] :] if e.args and isinstance(e.args[0], int) else b"")
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, _Malformed):
                self._malformed(*e.__context__.args)
            elif isinstance(e.__context__, _TooBig):
                self._too_big()
            else:
                raise
            return
        except httptools.HttpParserError as e:
            self._malformed(400, str(e) or type(e).__name__)
            return
        if self.heads != before:
            self.raw_head = 0
        elif in_head:
            self.raw_head += len(data)
            if self.raw_head > self.limits.max_header_size:
                self._too_big()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: connection_lost cancels what is answered

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.bound.stop()
        for r in [self.reading, *self.queue]:
            if isinstance(r, Served):
                r.broke("the client connection closed")
        self.queue.clear()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_exception(ClientGone("the client connection closed"))
        if self.task is not None:
            self.task.cancel()  # the client left: its exchange stops and frees its place in line

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
        self.head_bytes += len(name) + len(value) + FIELD_EXTRA  # _count's, inline: once per field
        if self.head_bytes > self.limits.max_header_size:
            raise _TooBig
        if not self.in_body:  # trailer fields are dropped, and trailing whitespace trimmed (framing.py)
            self.headers.add(
                name.decode("utf-8", "surrogateescape"), value.rstrip(OWS).decode("utf-8", "surrogateescape")
            )

    def on_headers_complete(self) -> None:
        p = self.parser
        method = p.get_method().decode("ascii", "replace")
        self._count(len(method) + LINE_EXTRA + 2)
        self.heads += 1
        self.in_body = True
        version, h = p.get_http_version(), self.headers
        # the usual head (HTTP/1.1, one Host, no Transfer-Encoding) needs no more; any other is judged
        if version != "1.1" or len(h.getall("Host", ())) != 1 or "Transfer-Encoding" in h:
            if (no := framing.refusal(version, h)) is not None:
                raise _Malformed(*no)
        major, _, minor = version.partition(".")
        req = Served(
            self,
            method,
            b"".join(self.url).decode("utf-8", "surrogateescape"),
            (int(major), int(minor)),
            self.client,
            self.headers,
            p.should_keep_alive(),
        )
        if method == "CONNECT" and self._connect(req):
            return  # the proxy port routes it (front.py): not a request to answer here
        self.reading = req
        self.queue.append(req)
        if self.task is None:
            self._timer(0)
            self.task = self.spawn(self._run())
        self.flow()

    def _connect(self, req: Served) -> bool:
        """A CONNECT head: True when the connection takes it over (the proxy port's first head)."""
        return False

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
                req = self.queue.pop(0)
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
            await self._serve(req)
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
        self.report(self.client, Refusal(431, message, "bad_request"))
        self._stop(_Stop(431, "Request Header Fields Too Large", message))

    def _malformed(self, status: int, why: str) -> None:
        client = self.client
        malformed.info(client, "%s: %d malformed request: %s", client, status, why[:200])
        self._stop(_Stop(status, HTTPStatus(status).phrase, f"malformed request: {why[:200]}"))

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
        """Move the connection's one bound to ``seconds`` from now; 0 (or a bound of 0: none configured)
        lifts it."""
        if not self.lost:
            self.bound.set(seconds, then)

    def _expired(self) -> None:
        """Idle between requests, or a head begun and not completed in time: the connection closes."""
        if self.task is None and self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class H1Server(H1Connection):
    """An intercepted tunnel's connection: its requests go to ``serve`` with the ``Tunnel``
    (``Forwarder.tunneled``); the listener hears when it ends (``on_lost``)."""

    __slots__ = ("tunnel", "serve", "on_lost")

    def __init__(
        self,
        tunnel: Tunnel,
        serve: Serve,
        limits: Limits,
        report: Report,
        spawn: Spawn,
        on_lost: Callable[[H1Server], None],
    ) -> None:
        super().__init__(tunnel.client, limits, report, spawn)
        self.tunnel, self.serve, self.on_lost = tunnel, serve, on_lost

    def _serve(self, req: Served) -> Awaitable[None]:
        return self.serve(req, self.tunnel)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost:
            super().connection_lost(exc)
            self.on_lost(self)
