"""The listener: accepts client connections, reads the first request head, routes the connection.

The first request on a connection is read with h11 (a sans-io parser) only to decide what it is: a CONNECT
is handled here (intercepted for paced hosts, a blind tunnel for the rest); anything else hands the
connection, bytes already read included, to aiohttp's low-level server. An intercepted tunnel upgrades the
connection to TLS with a leaf for the CONNECT target and attaches another aiohttp protocol to the TLS
transport, which then serves any number of HTTP/1.1 requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from politeproxy.pacing.pacer import Pacer
from politeproxy.policy.access import Access
from politeproxy.policy.hosts import normalize_host
from politeproxy.proxy import intercept, tunnel
from politeproxy.proxy.forward import Forwarder
from politeproxy.proxy.responses import plain_response
from politeproxy.proxy.upstream import CHUNK, Upstream

log = logging.getLogger("politeproxy")


class _BadRequestOneLine(logging.Filter):
    """aiohttp logs a client's malformed request with a traceback at ERROR; make it one INFO line.

    Anything else (a real bug in a handler) keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            first = (exc.message or type(exc).__name__).strip().splitlines()[0][:200]
            record.msg, record.args = "%s: %d malformed request: %s", (remote, exc.code or 400, first)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


http_log = logging.getLogger("politeproxy.http")
http_log.addFilter(_BadRequestOneLine())


@dataclass
class Timeouts:
    handshake: float = 10.0
    header: float = 15.0
    idle: float = 60.0
    max_header_size: int = 32768
    max_connections: int = 4096  # client connections open at once (tunnels included)


class _TrackingServer(web.Server):
    """aiohttp's low-level server, telling us when one of its connections ends."""

    def __init__(self, handler: Any, on_lost: Callable[[RequestHandler], None], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._on_lost = on_lost

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._on_lost(handler)


class FrontProtocol(asyncio.Protocol):
    """Reads the first request head of a client connection and routes the connection."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if peer else "?"
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.proxy.timeouts.max_header_size)
        if not self.proxy.access.ip_allowed(self.client):
            self._fail(403, "Forbidden", f"client {self.client} is not in allow_clients", "forbidden")
            return
        self.timer = asyncio.get_running_loop().call_later(self.proxy.timeouts.header, self._header_timeout)

    def _header_timeout(self) -> None:
        if not self.done:
            self._fail(408, "Request Timeout", "no complete request head in time", "bad_request")

    def _fail(
        self, status: int, reason: str, message: str, why: str, extra: dict[str, str] | None = None
    ) -> None:
        self.done = True
        if self.timer:
            self.timer.cancel()
        log.info("%s: %d %s", self.client, status, message)
        self.proxy.metrics.rejected("other", why)
        if self.transport and not self.transport.is_closing():
            self.transport.write(plain_response(status, reason, message, extra))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.done:
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
        head_size = len(self.buf) - len(self.conn.trailing_data[0])
        limit = self.proxy.timeouts.max_header_size
        if head_size > limit:
            self._fail(
                431,
                "Request Header Fields Too Large",
                f"request head of {head_size} bytes is over max_header_size {limit}",
                "bad_request",
            )
            return
        self.done = True
        if self.timer:
            self.timer.cancel()
        assert self.transport is not None
        if event.method == b"CONNECT":
            self.transport.pause_reading()
            leftover = self._after_head()
            asyncio.get_running_loop().create_task(self._connect(event, leftover))
            return
        # Everything else: aiohttp parses it again from the first byte and serves the connection.
        proto = self.proxy.plain_server()
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        proto.data_received(bytes(self.buf))

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
        target = req.target.decode("latin-1")
        host, sep, port_s = target.rpartition(":")
        host = normalize_host(host)
        if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
            self._fail(400, "Bad Request", f"CONNECT needs host:port, got {target!r}", "bad_request")
            return
        port = int(port_s)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers}
        if not self.proxy.access.auth_ok(headers.get("proxy-authorization")):
            self._fail(
                407,
                "Proxy Authentication Required",
                "proxy authentication required",
                "auth",
                {"Proxy-Authenticate": 'Basic realm="politeproxy"'},
            )
            return
        if self.proxy.hosts_paced(host):
            await self.proxy.intercept(self.transport, self.client, host, port, leftover)
        else:
            await self.proxy.tunnel(self.transport, self.client, host, port, leftover)


class Proxy:
    """Everything the I/O layer needs, wired once; ``app.py`` builds it from the config."""

    def __init__(
        self,
        *,
        ca: Any,
        classifier: Any,
        pacer: Pacer,
        upstream: Upstream,
        metrics: Any,
        access: Access,
        timeouts: Timeouts,
        robots: Any = None,
        log_json: bool = False,
        health: Callable[[], dict[str, Any]] | None = None,
        tunnel_ports: frozenset[int] = frozenset({443}),
        allow_private_destinations: bool = False,
    ) -> None:
        self.tunnel_ports = tunnel_ports
        self.allow_private_destinations = allow_private_destinations
        self.ca = ca
        self.classifier = classifier
        self.pacer = pacer
        self.upstream = upstream
        self.metrics = metrics
        self.access = access
        self.timeouts = timeouts
        self.robots = robots
        self.log_json = log_json
        self.health = health or (lambda: {})
        self.tunnels: dict[RequestHandler, tuple[str, int]] = {}
        self.server: asyncio.Server | None = None
        self.open_tunnels = 0
        kwargs: dict[str, Any] = dict(
            handler_cancellation=True,  # a client that leaves frees its place in line
            keepalive_timeout=timeouts.idle,
            max_line_size=timeouts.max_header_size,
            max_field_size=timeouts.max_header_size,
            auto_decompress=False,
            access_log=None,
            read_bufsize=CHUNK,
            lingering_time=2.0,
            logger=http_log,
        )
        self.forwarder = Forwarder(
            ca=ca,
            classifier=classifier,
            pacer=pacer,
            upstream=upstream,
            metrics=metrics,
            access=access,
            robots=robots,
            log_json=log_json,
            health=self.health,
            tunnel_target=self.tunnels.get,
        )
        self.plain_server = web.Server(self.forwarder.handle, **kwargs)
        self.tunnel_server = _TrackingServer(self.forwarder.handle, self._tunnel_lost, **kwargs)

    def hosts_paced(self, host: str) -> bool:
        return self.classifier.hosts.matches(host)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: FrontProtocol(self), host, port, reuse_address=True, backlog=2048
        )
        return self.server

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server:
            self.server.close()
        await self.plain_server.shutdown(1.0)
        await self.tunnel_server.shutdown(1.0)

    def _tunnel_change(self, delta: int) -> None:
        self.open_tunnels += delta
        self.metrics.tunnels_open.set(self.open_tunnels)

    def _tunnel_lost(self, handler: RequestHandler) -> None:
        if self.tunnels.pop(handler, None) is not None:
            self._tunnel_change(-1)

    # -- CONNECT ------------------------------------------------------------------------------------

    # -- CONNECT ------------------------------------------------------------------------------------

    async def intercept(
        self, transport: asyncio.Transport, client: str, host: str, port: int, leftover: bytes
    ) -> None:
        def attach(tls: asyncio.Transport) -> asyncio.Protocol:
            proto = self.tunnel_server()
            self.tunnels[proto] = (host, port)
            self._tunnel_change(+1)
            return proto

        await intercept.upgrade(
            transport,
            client,
            host,
            port,
            leftover,
            context_for=self.ca.context_for,
            handshake_timeout=self.timeouts.handshake,
            attach=attach,
        )

    async def tunnel(
        self, transport: asyncio.Transport, client: str, host: str, port: int, leftover: bytes
    ) -> None:
        def bytes_seen(from_client: bool, n: int) -> None:
            self.metrics.bytes.labels("client_to_upstream" if from_client else "upstream_to_client").inc(n)

        await tunnel.open_tunnel(
            transport,
            client,
            host,
            port,
            leftover,
            dest=self.upstream.tunnel_address(host, port),
            connect_timeout=self.upstream.connect_timeout,
            idle=self.timeouts.idle,
            on_open=self._tunnel_change,
            on_bytes=bytes_seen,
        )
