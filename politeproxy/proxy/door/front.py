"""The proxy port's connection: the project's one server protocol (h1server.H1Connection) reads every byte.

Its first head decides what the connection is. A CONNECT is routed here (intercept, tunnel or refuse, by
``policy.routing``), and the connection is handed on with the bytes read after the head. Anything else is a
plain connection that this protocol keeps serving: absolute-form ``http://`` requests, and the admin paths
in origin form, each answered through the listener's ``plain`` (``Forwarder.plain``). The listener
(listener.py) owns the connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol, cast

from multidict import CIMultiDict

from politeproxy.policy import routing
from politeproxy.policy.access import Access
from politeproxy.policy.routing import Refusal, Route, Target
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.common.responses import BurstLimitedLog, plain_response
from politeproxy.proxy.door.h1server import H1Connection, Limits, Report
from politeproxy.proxy.door.served import Served

log = logging.getLogger("politeproxy")
refusals = BurstLimitedLog(log)  # refusal lines, rate-limited per client
TLS_HANDSHAKE = b"\x16"  # a TLS record of type handshake: no HTTP method starts with this byte
TLS_TO_PLAIN_PORT = (
    "the client speaks TLS to the proxy port (a ClientHello, not a request): this proxy speaks plain HTTP "
    "to its clients; use http:// for the proxy URL (HTTPS_PROXY=http://HOST:PORT), not https://"
)
CHALLENGE = {"Proxy-Authenticate": 'Basic realm="politeproxy"'}


class PortLimits(Limits, Protocol):
    """The bounds of a connection on the proxy port (listener.Timeouts): a served connection's, and how many
    connections the port takes at once."""

    @property
    def max_connections(self) -> int: ...


class Listener(Protocol):
    """What the front needs of the listener (listener.Proxy, which owns the connections and imports
    this module): the bounds, the checks, and where a request or a routed connection goes."""

    @property
    def timeouts(self) -> PortLimits: ...
    @property
    def access(self) -> Access: ...
    @property
    def events(self) -> ProxyEvents: ...
    @property
    def tunnel_ports(self) -> frozenset[int]: ...
    @property
    def clients(self) -> set[asyncio.Transport]: ...
    def admit(self, transport: asyncio.Transport) -> bool: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...
    def hosts_paced(self, host: str) -> bool: ...
    def plain(self, req: Served) -> Awaitable[None]: ...
    def report(self, client: str, r: Refusal) -> None: ...
    async def intercept(
        self, transport: asyncio.Transport, tunnel: Tunnel, leftover: bytes, answered: bool = False
    ) -> None: ...
    async def tunnel(self, front: FrontProtocol, target: Target, leftover: bytes, who: str) -> None: ...


class FrontProtocol(H1Connection):
    """One connection on the proxy port: its first head routes it; a plain one is served here."""

    __slots__ = ("proxy", "done", "connect")

    def __init__(self, proxy: Listener) -> None:
        report: Report = proxy.report
        super().__init__("?", proxy.timeouts, report, proxy.spawn)
        self.proxy = proxy
        self.done = False  # refused, or handed on: this protocol answers nothing more
        self.connect: Served | None = None  # the CONNECT head, until the bytes after it are known

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's transport: asyncio's, or aiofastnet's (which does not subclass asyncio.Transport)
        self.transport = stream = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if peer else "?"
        if not self.proxy.access.ip_allowed(self.client):
            self._fail(403, "Forbidden", f"client {self.client} is not in allow_clients", "forbidden")
            return
        if not self.proxy.admit(stream):
            limit = self.proxy.timeouts.max_connections
            self._fail(503, "Service Unavailable", f"too many connections (max {limit})", "connections")
            return
        self._timer(self.limits.header)  # the first head, from the connection's start: 408 (``_expired``)

    def connection_lost(self, exc: BaseException | None) -> None:
        # Only while this protocol still owns the connection (before a CONNECT hands it on).
        if self.transport is not None:
            self.proxy.clients.discard(self.transport)
        if self.done:
            self.lost = True
            self.bound.stop()
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        if not self.heads and not self.raw_head and data[:1] == TLS_HANDSHAKE:
            self._speaks_tls()
            return
        super().data_received(data)

    def eof_received(self) -> bool | None:
        """The client closed its sending side: a request read and not yet answered still gets its answer
        (RFC 9112 section 9.6; issue 42 item 7), and the connection closes after the answers owed."""
        if self.done or (self.task is None and not self.queue):
            return None  # nothing owed: the transport closes
        if self.reading is not None:
            self.reading.broke("the client closed its side before the request body was whole")
        self.stopped = True
        self.flow()
        return True

    def on_message_begin(self) -> None:
        if self.heads:
            super().on_message_begin()
        else:  # the first head's timer runs from the connection's start, not from its first byte
            self.url, self.headers, self.head_bytes = [], CIMultiDict(), 0

    def _expired(self) -> None:
        if not self.heads and not self.done:
            self._fail(408, "Request Timeout", "no complete request head in time", "bad_request")
        else:
            super()._expired()

    def _malformed(self, status: int, why: str) -> None:
        if not self.heads or self.heads == 1 and self.task is None and not self.queue:
            self.proxy.events.rejected("other", "bad_request")  # the first head: counted, as a refusal
        super()._malformed(status, why)

    def _serve(self, req: Served) -> Awaitable[None]:
        return self.proxy.plain(req)

    # -- the first head: a CONNECT --------------------------------------------------------------------

    def _connect(self, req: Served) -> bool:
        if self.heads != 1:
            return False  # a CONNECT after plain requests: answered as a request (400), then the close
        self.connect = req
        return True

    def _upgraded(self, rest: bytes) -> None:
        req, self.connect = self.connect, None
        if req is None:
            super()._upgraded(rest)
            return
        self.done = self.stopped = True
        self.bound.stop()
        assert self.transport is not None
        self.transport.pause_reading()
        self.proxy.spawn(self._route(req, rest))
        self._spent()

    def _spent(self) -> None:
        """Drop the parser once a CONNECT is routed. uvloop's transport keeps this protocol's
        data_received after a TLS upgrade installs a buffered protocol, so a FrontProtocol lives as long
        as its connection; its parser and head need not (issue 15: memory per held request)."""
        del self.parser, self.url, self.headers, self.queue  # every call returns early from now on (done)

    def _fail(
        self, status: int, reason: str, message: str, why: str, extra: dict[str, str] | None = None
    ) -> None:
        """Refuse the connection's first head (or the connection itself) and close."""
        self.done = self.stopped = True
        self.bound.stop()
        refusals.info(self.client, "%s: %d %s", self.client, status, message)
        self.proxy.events.rejected("other", why)
        if self.transport and not self.transport.is_closing():
            self.transport.write(plain_response(status, reason, message, extra))
            self.transport.close()

    def _speaks_tls(self) -> None:
        """A TLS ClientHello where a request head belongs: the client was given an https:// proxy URL.
        The log line names the fix; the 400 is for a human with a raw socket (a TLS client reads no
        HTTP), then the connection closes."""
        self._fail(400, "Bad Request", TLS_TO_PLAIN_PORT, "bad_request")

    def refuse(self, r: Refusal) -> None:
        self._fail(r.status, r.reason, r.message, r.why)

    async def _route(self, req: Served, leftover: bytes) -> None:
        assert self.transport is not None
        creds = req.headers.get("Proxy-Authorization")
        if not self.proxy.access.auth_ok(creds):
            why = "proxy authentication required"
            self._fail(407, "Proxy Authentication Required", why, "auth", CHALLENGE)
            return
        look_alike = self.proxy.access.look_alike(creds)
        if look_alike is not None:  # a name counted as a token pipeline's, but not its exact name
            self._fail(407, "Proxy Authentication Required", look_alike, "auth", CHALLENGE)
            return
        # Validated before anything else sees it: classification, leaf files, metrics labels.
        target = routing.parse_connect_target(req.target)
        if isinstance(target, Refusal):
            self.refuse(target)
            return
        paced = self.proxy.hosts_paced(target.host)
        decision = routing.route(target, paced=paced, tunnel_ports=self.proxy.tunnel_ports)
        if isinstance(decision, Refusal):
            self.refuse(decision)
            return
        # The pipeline every request in this tunnel counts in, read once: its user name, else the address.
        who = self.proxy.access.pipeline(creds, self.client)
        if decision is Route.INTERCEPT:
            tunnel = Tunnel(self.client, target.host, target.port, who)
            await self.proxy.intercept(self.transport, tunnel, leftover)
        else:
            await self.proxy.tunnel(self, target, leftover, who)
