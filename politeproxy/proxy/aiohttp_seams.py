"""Every aiohttp internal the proxy relies on, in one place: the rest of politeproxy uses aiohttp's
documented API, and these seams (issue 23).

Checked against aiohttp 3.14.5, the version installed when this was written. pyproject asks for
aiohttp>=3.10, but older versions do not fit: the seams test run against 3.13.5, 3.12.15 and 3.11.18 finds
RequestHandler's ``_upgraded`` missing (it was ``_upgrade`` before 3.14, so the head bound would raise on
every read), and 3.11 has no ``ResponseHandler.closed``. ``CHECKED`` is 3.14 by minor version;
tests/unit/proxy/test_aiohttp_seams.py fails, naming what is wrong, when the installed aiohttp is outside
it or one of the internals below is gone. On an aiohttp upgrade: read the internals below in the new
version's source, run that test and tests/e2e/test_front_limits.py, then widen ``CHECKED``.

Relied on, and why:

1. ``aiohttp.web_protocol.RequestHandler`` subclassed, with ``__slots__`` (``HandlerSeam``), and its private
   state: ``_force_close``, ``_close``, ``_upgraded`` (no further head will be parsed), ``_request_count``
   (heads parsed on this connection), ``_messages`` (queued ``(message, payload)`` pairs: the newest
   payload tells whether a body is being read) and ``_current_request`` (a request is being answered);
   its ``data_received`` and ``handle_error(request, status, exc, message)`` are overridden. Why: aiohttp
   bounds each header line, not a whole head; responses.BoundedHandler bounds the head (max_header_size).
2. ``web.Server`` subclassed (``ServerSeam``): calling it is its protocol factory, which makes each
   connection's handler from its private ``_loop`` and ``_kwargs`` (the handler settings it was given);
   ``connection_lost(handler, exc)`` is called when a connection ends. Why: the bounded handler.
3. ``web.Server(handler_cancellation=True)``: the server keeps it (it is not a RequestHandler argument).
   Why: a client that leaves cancels its handler and so frees its place in a host's line.
4. ``RequestHandler(access_log=None)``: annotated ``Logger``, but None turns the access log off (as
   ``web.run_app(access_log=None)`` documents). Why: the proxy writes its own access record.
5. A RequestHandler attached to a live transport mid-stream (``hand_over``): ``set_protocol``,
   ``connection_made``, then ``data_received`` with the bytes read already. Why: front.py reads the first
   head to route the connection, then aiohttp parses it again from the first byte.
6. ``aiohttp.http_exceptions.HttpProcessingError`` (``.code``, ``.message``): what aiohttp's server logs
   for a malformed request (responses.BadRequestOneLine) and raises from a request body's read.
7. ``BaseRequest.writer`` (a ``100 Continue`` written before the response on a plain connection):
   ``write_early``. (Intercepted tunnels are served by h1server.py, not aiohttp: no seam there.)
8. The client side: ``ClientResponse.connection`` and its ``protocol`` (aiohttp's ResponseHandler), whose
   ``closed`` future ends with an exception on a reset and whose ``eof_received`` hears a TLS close_notify
   (``connection_parts``). Why: upstream.EndWatch tells a cut close-delimited body from a clean end.
10. ``RequestHandler.eof_received`` overridden to return True while a request read is unanswered, with
   ``close()`` (documented: no further request; the connection closes once the request being handled is
   answered, and a request pipelined behind it is never handled): a client that half-closes after its
   request gets the answer (RFC 9112 section 9.6; issue 42 item 7). aiohttp's own returns None, so the
   transport closed at the client's FIN and the answer was lost. Reads ``_task_handler`` (the connection's
   serving task), ``_messages`` (1) and ``_waiter`` (set while that task waits for the next request).
9. ``TCPConnector._get(key, traces)`` overridden (unasked.CheckedConnector), and ``ResponseHandler``'s
   ``should_close`` and ``Connection.protocol`` read: a pooled connection handed out is first checked for
   bytes nobody asked for (issue 25 item 4), and one that spoke is closed, never reused.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypedDict, Unpack, cast

import aiohttp
from aiohttp import StreamReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

__all__ = [
    "CHECKED",
    "HandlerSeam",
    "HandlerSettings",
    "HttpProcessingError",
    "RequestHandler",
    "ServerOptions",
    "ServerSeam",
    "connection_parts",
    "hand_over",
    "write_early",
]

CHECKED = ((3, 14), (3, 14))  # the aiohttp (major, minor) versions these seams were read against, inclusive


class _HandlerArgs(TypedDict, total=False):
    """The RequestHandler settings the listener passes (listener._server_kwargs)."""

    keepalive_timeout: float
    max_line_size: int
    max_field_size: int
    auto_decompress: bool
    access_log: None  # internal 4: None turns it off
    read_bufsize: int
    lingering_time: float
    logger: logging.Logger


class ServerOptions(_HandlerArgs, total=False):
    """What the listener gives ``web.Server``: the handler settings, and one the server keeps (3)."""

    handler_cancellation: bool


class HandlerSettings(_HandlerArgs, total=False):
    """What ``web.Server`` hands each RequestHandler it makes (2)."""

    loop: asyncio.AbstractEventLoop


class HandlerSeam(RequestHandler):
    """aiohttp's per-connection handler, its internal state read under plain names (1)."""

    __slots__ = ()

    def __init__(self, manager: web.Server, **kw: Unpack[HandlerSettings]) -> None:
        # aiohttp annotates access_log as Logger; None is accepted and turns the access log off (4)
        super().__init__(manager, **kw)  # type: ignore[arg-type]

    def heads_over(self) -> bool:
        """No further head will be parsed on this connection: it is closing, or upgraded."""
        return bool(self._force_close or self._close or self._upgraded)

    def heads_parsed(self) -> int:
        return self._request_count

    def newest_payload(self) -> StreamReader | None:
        """The body of the newest queued request, None when none is queued."""
        return self._messages[-1][1] if self._messages else None

    def answering(self) -> bool:
        return self._current_request is not None

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's protocol returns bool | None
        """The client closed its sending side (10): with a request read and not yet answered, the
        connection stays open to write the answer, and closes after it (nothing more can come); with none,
        it closes now (asyncio does, on a false return)."""
        owed = self._task_handler is not None and (bool(self._messages) or self._waiter is None)
        if owed:
            self.close()
        return owed


class ServerSeam(web.Server):
    """aiohttp's low-level server; calling it makes a connection's handler (2)."""

    def handler_settings(self) -> HandlerSettings:
        """The settings aiohttp would make a RequestHandler with."""
        return cast(HandlerSettings, {"loop": self._loop, **self._kwargs})


def hand_over(server: web.Server, transport: asyncio.Transport, first: bytes) -> RequestHandler:
    """Let a new handler of ``server`` serve ``transport``, whose ``first`` bytes were read already (5)."""
    handler = server()
    transport.set_protocol(handler)
    handler.connection_made(transport)
    handler.data_received(first)
    return handler


async def write_early(request: web.BaseRequest, data: bytes) -> None:
    """Write ``data`` to the client before the response starts: an interim ``100 Continue`` (7)."""
    writer = request.writer
    await writer.write(data)


def connection_parts(
    resp: aiohttp.ClientResponse,
) -> tuple[asyncio.Protocol | None, asyncio.Future[None] | None, asyncio.Transport | None]:
    """The protocol of ``resp``'s connection, its ``closed`` future and its transport (8); each None
    when the connection is gone."""
    conn = resp.connection
    proto = conn.protocol if conn is not None else None
    closed = proto.closed if proto is not None else None
    return proto, closed, conn.transport if conn is not None else None
