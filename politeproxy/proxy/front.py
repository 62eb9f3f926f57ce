"""The front of every client connection: read the first request head with h11 and route the connection.

A CONNECT is routed here (intercept, tunnel or refuse, by ``policy.routing``); anything else is handed,
bytes already read included, to aiohttp's server. The listener (listener.py) owns the connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol, cast

import h11

from politeproxy.policy import routing
from politeproxy.policy.access import Access
from politeproxy.policy.routing import Refusal, Route, Target
from politeproxy.proxy.aiohttp_seams import hand_over
from politeproxy.proxy.events import ProxyEvents
from politeproxy.proxy.exchange import Tunnel
from politeproxy.proxy.responses import BadRequestOneLine, BoundedServer, BurstLimitedLog, plain_response

log = logging.getLogger("politeproxy")
refusals = BurstLimitedLog(log)  # refusal lines, rate-limited per client
http_log = logging.getLogger("politeproxy.http")
TLS_HANDSHAKE = b"\x16"  # a TLS record of type handshake: no HTTP method starts with this byte
TLS_TO_PLAIN_PORT = (
    "the client speaks TLS to the proxy port (a ClientHello, not a request): this proxy speaks plain HTTP "
    "to its clients; use http:// for the proxy URL (HTTPS_PROXY=http://HOST:PORT), not https://"
)
http_log.addFilter(BadRequestOneLine(refusals))


class Limits(Protocol):
    """The bounds a connection's first head is read within (listener.Timeouts)."""

    @property
    def header(self) -> float: ...
    @property
    def max_header_size(self) -> int: ...
    @property
    def max_connections(self) -> int: ...


class Listener(Protocol):
    """What the front needs of the listener (listener.Proxy, which owns the connections and imports
    this module): the bounds, the checks, and where a routed connection goes."""

    @property
    def timeouts(self) -> Limits: ...
    @property
    def access(self) -> Access: ...
    @property
    def events(self) -> ProxyEvents: ...
    @property
    def tunnel_ports(self) -> frozenset[int]: ...
    @property
    def clients(self) -> set[asyncio.Transport]: ...
    @property
    def plain_server(self) -> BoundedServer: ...
    def admit(self, transport: asyncio.Transport) -> bool: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...
    def hosts_paced(self, host: str) -> bool: ...
    async def intercept(
        self, transport: asyncio.Transport, tunnel: Tunnel, leftover: bytes, answered: bool = False
    ) -> None: ...
    async def tunnel(self, front: FrontProtocol, target: Target, leftover: bytes, who: str) -> None: ...


class FrontProtocol(asyncio.Protocol):
    """Reads the first request head of a client connection and routes the connection."""

    def __init__(self, proxy: Listener) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done = False
        self.timer: asyncio.TimerHandle | None = None
        self.client = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's transport: asyncio's, or aiofastnet's (which does not subclass asyncio.Transport)
        self.transport = stream = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if peer else "?"
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.proxy.timeouts.max_header_size)
        if not self.proxy.access.ip_allowed(self.client):
            self._fail(403, "Forbidden", f"client {self.client} is not in allow_clients", "forbidden")
            return
        if not self.proxy.admit(stream):
            limit = self.proxy.timeouts.max_connections
            self._fail(503, "Service Unavailable", f"too many connections (max {limit})", "connections")
            return
        self.timer = asyncio.get_running_loop().call_later(self.proxy.timeouts.header, self._header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        # Only while this protocol still owns the connection (before it is handed on).
        self.done = True
        if self.timer:
            self.timer.cancel()
        if self.transport is not None:
            self.proxy.clients.discard(self.transport)

    def _header_timeout(self) -> None:
        if not self.done:
            self._fail(408, "Request Timeout", "no complete request head in time", "bad_request")

    def _fail(
        self, status: int, reason: str, message: str, why: str, extra: dict[str, str] | None = None
    ) -> None:
        self.done = True
        if self.timer:
            self.timer.cancel()
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

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        if not self.buf and data[:1] == TLS_HANDSHAKE:
            self._speaks_tls()
            return
        self.buf += data
        self.conn.receive_data(data)
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError as e:
            status = e.error_status_hint if e.error_status_hint >= 400 else 400
            reason = "Request Header Fields Too Large" if status == 431 else "Bad Request"
            self._fail(status, reason, f"malformed request: {e}", "bad_request")
            return
        if event is h11.NEED_DATA:
            return
        if not isinstance(event, h11.Request):
            self._fail(400, "Bad Request", "malformed request", "bad_request")
            return
        # h11 bounds only an incomplete head; one that arrived whole in a single read is checked here.
        size = len(self.buf) - len(self.conn.trailing_data[0])
        limit = self.proxy.timeouts.max_header_size
        if size > limit:
            message = f"request head of {size} bytes is over max_header_size {limit}"
            self._fail(431, "Request Header Fields Too Large", message, "bad_request")
            return
        self.done = True
        if self.timer:
            self.timer.cancel()
        assert self.transport is not None
        if event.method == b"CONNECT":
            self.transport.pause_reading()
            self.proxy.spawn(self._connect(event, self._after_head()))
            self._spent()
            return
        # Everything else: aiohttp parses it again from the first byte and serves the connection.
        hand_over(self.proxy.plain_server, self.transport, bytes(self.buf))

    def _spent(self) -> None:
        """Drop the head parser once a CONNECT is routed. uvloop's transport keeps this protocol's
        data_received after a TLS upgrade installs a buffered protocol, so a FrontProtocol lives as long
        as its connection; its h11 state and head bytes need not (issue 15: ~1.4 KiB per held request)."""
        del self.conn  # data_received returns early from now on (done)
        self.buf = bytearray()
        self.timer = None

    def _after_head(self) -> bytes:
        try:
            while True:
                ev = self.conn.next_event()
                if ev is h11.NEED_DATA or ev is h11.PAUSED or isinstance(ev, h11.EndOfMessage):
                    break
        except h11.RemoteProtocolError:
            pass
        return bytes(self.conn.trailing_data[0])

    async def _connect(self, req: h11.Request, leftover: bytes) -> None:
        assert self.transport is not None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers}
        if not self.proxy.access.auth_ok(headers.get("proxy-authorization")):
            challenge = {"Proxy-Authenticate": 'Basic realm="politeproxy"'}
            self._fail(
                407, "Proxy Authentication Required", "proxy authentication required", "auth", challenge
            )
            return
        look_alike = self.proxy.access.look_alike(headers.get("proxy-authorization"))
        if look_alike is not None:  # a name counted as a token pipeline's, but not its exact name
            challenge = {"Proxy-Authenticate": 'Basic realm="politeproxy"'}
            self._fail(407, "Proxy Authentication Required", look_alike, "auth", challenge)
            return
        # Validated before anything else sees it: classification, leaf files, metrics labels.
        target = routing.parse_connect_target(req.target.decode("latin-1"))
        if isinstance(target, Refusal):
            self.refuse(target)
            return
        paced = self.proxy.hosts_paced(target.host)
        decision = routing.route(target, paced=paced, tunnel_ports=self.proxy.tunnel_ports)
        if isinstance(decision, Refusal):
            self.refuse(decision)
            return
        # The pipeline every request in this tunnel counts in, read once: its user name, else the address.
        who = self.proxy.access.pipeline(headers.get("proxy-authorization"), self.client)
        if decision is Route.INTERCEPT:
            tunnel = Tunnel(self.client, target.host, target.port, who)
            await self.proxy.intercept(self.transport, tunnel, leftover)
        else:
            await self.proxy.tunnel(self, target, leftover, who)
