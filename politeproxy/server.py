"""Proxy I/O: the listener, CONNECT handling, TLS interception, the blind tunnel and forwarding.

The first request on a connection is read with h11 (a sans-io parser) only to decide what it is: a CONNECT
is handled here; anything else hands the connection, bytes already read included, to aiohttp's low-level
server. An intercepted tunnel upgrades the connection to TLS with a leaf for the CONNECT target and attaches
another aiohttp protocol to the TLS transport, which then serves any number of HTTP/1.1 requests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import h11
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from politeproxy.backoff import parse_retry_after, retry_after_seconds
from politeproxy.classify import Klass
from politeproxy.hostmatch import normalize_host
from politeproxy.pacer import Pacer, WaitTooLong
from politeproxy.upstream import CHUNK, Upstream, strip_hop_by_hop

log = logging.getLogger("politeproxy")
access_log = logging.getLogger("politeproxy.access")


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

REPLAYABLE = frozenset({"GET", "HEAD"})


def _address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a peer name, without an IPv6 zone; None when it is not an address."""
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None


def is_loopback(ip: str) -> bool:
    addr = _address(ip)
    return addr is not None and addr.is_loopback


class Access:
    """Who may use the proxy: loopback only by default; CIDRs and/or Basic proxy authentication."""

    def __init__(self, allow_clients: list[str], users: dict[str, str]) -> None:
        self.networks = [ipaddress.ip_network(c, strict=False) for c in allow_clients]
        self.users = users

    @property
    def open_beyond_loopback(self) -> bool:
        return bool(self.networks or self.users)

    def ip_allowed(self, ip: str) -> bool:
        if is_loopback(ip):
            return True
        if self.networks:
            addr = _address(ip)
            return addr is not None and any(addr in n for n in self.networks)
        return bool(self.users)

    def auth_ok(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user, _, password = (
                base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return False
        want = self.users.get(user)
        return want is not None and hmac.compare_digest(want.encode(), password.encode())


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


@dataclass
class Timeouts:
    handshake: float = 10.0
    header: float = 15.0
    idle: float = 60.0
    max_header_size: int = 32768


class _Relay(asyncio.Protocol):
    """One side of a blind byte tunnel; flow control pauses the other side's reading."""

    def __init__(self, pair: _RelayPair) -> None:
        self.pair = pair
        self.transport: asyncio.Transport | None = None
        self.peer: _Relay | None = None
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.pair.touch()
        if self.peer and self.peer.transport:
            self.peer.transport.write(data)
            self.pair.bytes_relayed(self, len(data))

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer and peer.transport and peer.transport.can_write_eof() and not peer.eof:
            peer.transport.write_eof()
            return True  # keep our writing side open: half-close passes through
        return False

    def pause_writing(self) -> None:
        if self.peer and self.peer.transport:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer and self.peer.transport:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.pair.close()


class _RelayPair:
    def __init__(
        self, idle: float, on_close: Callable[[], None], on_bytes: Callable[[bool, int], None]
    ) -> None:
        self.client = _Relay(self)
        self.upstream = _Relay(self)
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.idle = idle
        self.last = time.monotonic()
        self.closed = False
        self.on_close = on_close
        self.on_bytes = on_bytes
        self.timer = asyncio.get_running_loop().call_later(idle, self._check_idle)

    def touch(self) -> None:
        self.last = time.monotonic()

    def bytes_relayed(self, side: _Relay, n: int) -> None:
        self.on_bytes(side is self.client, n)

    def _check_idle(self) -> None:
        left = self.last + self.idle - time.monotonic()
        if left > 0:
            self.timer = asyncio.get_running_loop().call_later(left, self._check_idle)
        else:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.timer.cancel()
        for side in (self.client, self.upstream):
            if side.transport and not side.transport.is_closing():
                side.transport.close()
        self.on_close()


class _Pending(asyncio.Protocol):
    """Holds application bytes that arrive with the end of the TLS handshake until aiohttp is attached."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True


class _RelayedResponse(web.StreamResponse):
    """Sends the head with the first body chunk: one TLS record and one send for a small answer."""

    _send_headers_immediately = False


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
    ) -> None:
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
        self.plain_server = web.Server(self._handle, **kwargs)
        self.tunnel_server = _TrackingServer(self._handle, self._tunnel_lost, **kwargs)

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

    async def intercept(
        self, transport: asyncio.Transport, client: str, host: str, port: int, leftover: bytes
    ) -> None:
        loop = asyncio.get_running_loop()
        if leftover:
            # TLS bytes sent before our 200 would be lost to start_tls; refuse rather than corrupt.
            log.info("%s: CONNECT %s:%d: data sent before the tunnel was open; closing", client, host, port)
            transport.write(plain_response(400, "Bad Request", "data sent before CONNECT was answered"))
            transport.close()
            return
        try:
            ctx = self.ca.context_for(host)
        except Exception as e:  # noqa: BLE001 - a bad leaf must not take the listener down
            log.error("%s: no leaf for %s: %s", client, host, e)
            transport.write(plain_response(502, "Bad Gateway", f"cannot make a certificate for {host}"))
            transport.close()
            return
        transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pending = _Pending()
        try:
            tls = await loop.start_tls(
                transport,
                pending,
                ctx,
                server_side=True,
                ssl_handshake_timeout=self.timeouts.handshake,
            )
        except (ssl.SSLError, OSError, TimeoutError, ConnectionError) as e:
            why = (
                "timed out"
                if isinstance(e, TimeoutError)
                else (getattr(e, "reason", None) or str(e) or type(e).__name__)
            )
            log.info("%s: TLS handshake for %s failed: %s (does the client trust ca.pem?)", client, host, why)
            transport.abort()
            return
        if tls is None:
            transport.abort()
            return
        log.debug("%s: intercepting %s:%d", client, host, port)
        proto = self.tunnel_server()
        self.tunnels[proto] = (host, port)
        self._tunnel_change(+1)
        tls.set_protocol(proto)
        proto.connection_made(tls)
        if pending.chunks:
            proto.data_received(b"".join(pending.chunks))
        if pending.lost:
            proto.connection_lost(None)
        elif pending.eof:
            proto.eof_received()

    async def tunnel(
        self, transport: asyncio.Transport, client: str, host: str, port: int, leftover: bytes
    ) -> None:
        loop = asyncio.get_running_loop()
        dest_host, dest_port = self.upstream.tunnel_address(host, port)

        def bytes_seen(from_client: bool, n: int) -> None:
            self.metrics.bytes.labels("client_to_upstream" if from_client else "upstream_to_client").inc(n)

        pair = _RelayPair(self.timeouts.idle, lambda: self._tunnel_change(-1), bytes_seen)
        try:
            async with asyncio.timeout(self.upstream.connect_timeout):
                await loop.create_connection(lambda: pair.upstream, dest_host, dest_port)
        except (OSError, TimeoutError) as e:
            pair.timer.cancel()
            why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            log.info("%s: CONNECT %s:%d failed: %s", client, host, port, why)
            status, reason = (504, "Gateway Timeout") if isinstance(e, TimeoutError) else (502, "Bad Gateway")
            transport.write(plain_response(status, reason, f"cannot connect to {host}:{port}: {why}"))
            transport.close()
            return
        self._tunnel_change(+1)
        transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        transport.set_protocol(pair.client)
        pair.client.connection_made(transport)
        if leftover and pair.upstream.transport:
            pair.upstream.transport.write(leftover)
        transport.resume_reading()
        log.debug("%s: tunnel to %s:%d", client, host, port)

    # -- HTTP requests ------------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        target = self.tunnels.get(request.protocol)  # type: ignore[arg-type]
        if target is None:
            raw = request.raw_path
            if raw.startswith("/") or raw == "*":
                return await self._admin(request)
            if not self.access.auth_ok(request.headers.get("Proxy-Authorization")):
                self.metrics.rejected("other", "auth")
                return error_response(
                    407, "proxy authentication required", {"Proxy-Authenticate": 'Basic realm="politeproxy"'}
                )
            try:
                url = URL(raw, encoded=True)
            except ValueError:
                url = URL()
            if url.scheme not in ("http", "https") or not url.host:
                self.metrics.rejected("other", "bad_request")
                return error_response(400, f"not a URL this proxy can forward: {raw[:200]!r}")
            host = normalize_host(url.host)
            return await self._forward(request, url.scheme, host, url.port or 80, url.raw_path_qs)
        host, port = target
        hh = request.headers.get("Host", "")
        if not hh and request.version < (1, 1):
            hh = f"{host}:{port}"  # HTTP/1.0 may omit Host: inside a tunnel it can only mean the target
        h_host, sep, h_port = hh.rpartition(":")
        if not sep or "]" in h_port:
            h_host, h_port = hh, str(port)  # no port in Host: the tunnel's own
        path = request.raw_path
        if not path.startswith("/"):
            try:
                u = URL(path, encoded=True)
                h_host, h_port, path = u.host or "", str(u.port or 443), u.raw_path_qs
            except ValueError:
                h_host = ""
        if normalize_host(h_host) != host or not h_port.isdigit() or int(h_port) != port:
            self.metrics.rejected(host if self.hosts_paced(host) else "other", "misdirected")
            log.info("%s: 421 request for %r inside the tunnel to %s:%d", request.remote, hh, host, port)
            return error_response(421, f"this tunnel reaches only {host}:{port}, not {hh!r}")
        return await self._forward(request, "https", host, port, path)

    async def _admin(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.rel_url.path
        if request.method not in ("GET", "HEAD"):
            return error_response(405, "admin endpoints answer GET only")
        if path == "/metrics":
            return metrics_response(self.metrics)
        if path == "/healthz":
            return health_response(self.health)
        if path == "/ca.pem":
            return web.Response(body=self.ca.pem(), content_type="application/x-pem-file")
        return error_response(404, "not found: the admin endpoints are /metrics, /healthz and /ca.pem")

    async def _forward(
        self, request: web.BaseRequest, scheme: str, host: str, port: int, path: str
    ) -> web.StreamResponse:
        started = time.monotonic()
        klass = self.classifier.classify(request.method, host, path, "Range" in request.headers)
        label = host if klass is not Klass.PASSTHROUGH else "other"
        netloc = f"[{host}]" if ":" in host else host
        url = URL(f"{scheme}://{netloc}:{port}{path or '/'}", encoded=True)
        info: dict[str, Any] = {"wait": 0.0, "status": 0, "bytes": 0}
        try:
            resp = await self._exchange(request, klass, host, url, started, info)
        finally:
            info["duration"] = time.monotonic() - started
            self._access(request, host, klass, info)
        self.metrics.answered(label, klass.value, info["status"] or None)
        return resp

    def _access(self, request: web.BaseRequest, host: str, klass: Klass, info: dict[str, Any]) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        if self.log_json:
            access_log.info(
                json.dumps(
                    {
                        "client": request.remote,
                        "method": request.method,
                        "host": host,
                        "class": klass.value,
                        "wait": round(info["wait"], 4),
                        "status": info["status"],
                        "bytes": info["bytes"],
                        "duration": round(info["duration"], 4),
                        **({"note": info["note"]} if "note" in info else {}),
                    }
                )
            )
        else:
            access_log.info(
                "%s %s %s %s wait=%.3fs status=%s bytes=%d duration=%.3fs%s",
                request.remote,
                request.method,
                host,
                klass.value,
                info["wait"],
                info["status"],
                info["bytes"],
                info["duration"],
                f" note={info['note']}" if "note" in info else "",
            )

    async def _exchange(
        self,
        request: web.BaseRequest,
        klass: Klass,
        host: str,
        url: URL,
        arrived: float,
        info: dict[str, Any],
    ) -> web.StreamResponse:
        method = request.method
        has_body = request.body_exists
        headers = strip_hop_by_hop(request.headers, drop=("Host", "Expect"))
        retries_left = self.pacer.settings.retries if method in REPLAYABLE and not has_body else 0
        if klass is not Klass.PASSTHROUGH and self.robots is not None:
            self.robots.ensure(host)
        if has_body and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body: AsyncIterator[bytes] | None = (
            self._body(request, self.metrics.bytes.labels("client_to_upstream")) if has_body else None
        )
        async with AsyncExitStack() as stack:
            while True:
                try:
                    if klass is Klass.PACED:
                        info["wait"] = await self.pacer.wait_paced(host, arrived)
                    elif klass is Klass.EXEMPT:
                        info["wait"] = await stack.enter_async_context(self.pacer.exempt(host, arrived))
                except WaitTooLong as e:
                    info["status"], info["note"] = 503, "max_wait"
                    return error_response(503, e.why, {"Retry-After": str(retry_after_seconds(e.wait))})
                try:
                    upstream = await self.upstream.request(method, str(url), headers, body)
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    status, message = self._upstream_error(e, url)
                    if klass is not Klass.PASSTHROUGH:
                        await self.pacer.record(host, None, None)
                    info["status"], info["note"] = status, "upstream_error"
                    log.info("%s %s: %d %s", method, url, status, message)
                    return error_response(status, message)
                if klass is not Klass.PASSTHROUGH:
                    ra = parse_retry_after(upstream.headers.get("Retry-After"), time.time())
                    delay = await self.pacer.record(host, upstream.status, ra)
                    if delay is not None and retries_left > 0:
                        elapsed = time.monotonic() - arrived
                        if elapsed + delay.seconds < self.pacer.settings.max_wait:
                            retries_left -= 1
                            upstream.close()
                            self.metrics.retries.labels(host).inc()
                            log.info(
                                "%s %s: %d from upstream; retrying after %.1fs",
                                method,
                                url,
                                upstream.status,
                                delay.seconds,
                            )
                            if klass is Klass.EXEMPT:
                                await stack.aclose()
                            continue
                info["status"] = upstream.status
                return await self._relay(request, upstream, info)

    @staticmethod
    async def _body(request: web.BaseRequest, counter: Any) -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(CHUNK):
            counter.inc(len(chunk))
            yield chunk

    @staticmethod
    def _upstream_error(e: BaseException, url: URL) -> tuple[int, str]:
        where = f"{url.host}:{url.port}"
        if isinstance(e, aiohttp.ClientConnectorDNSError):
            return 502, f"cannot resolve {url.host}"
        if isinstance(e, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
            return 502, f"TLS to {where} failed: {getattr(e, 'certificate_error', e)}"
        if isinstance(e, aiohttp.ConnectionTimeoutError):
            return 504, f"connecting to {where} timed out"
        if isinstance(e, aiohttp.ServerTimeoutError | TimeoutError):
            return 504, f"{where} did not answer in time"
        if isinstance(e, aiohttp.ClientConnectorError):
            return 502, f"cannot connect to {where}: {e.strerror or e}"
        return 502, f"upstream {where} failed: {type(e).__name__}: {e}"

    async def _relay(
        self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, info: dict[str, Any]
    ) -> web.StreamResponse:
        headers = strip_hop_by_hop(upstream.headers)
        out = _RelayedResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        counter = self.metrics.bytes.labels("upstream_to_client")
        try:
            await out.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK):
                await out.write(chunk)
                info["bytes"] += len(chunk)
                counter.inc(len(chunk))
            await out.write_eof()
        except (aiohttp.ClientError, TimeoutError) as e:
            # Headers are gone already: cut the client off so it sees a truncated body, never a short one.
            info["note"] = f"upstream_broke:{type(e).__name__}"
            log.info("%s %s: upstream failed mid-body: %r", request.method, upstream.url, e)
            if request.transport is not None:
                request.transport.abort()
        finally:
            upstream.close() if not upstream.content.at_eof() else upstream.release()
        return out
