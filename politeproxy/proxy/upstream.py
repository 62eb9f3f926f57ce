"""The upstream side: one pooled aiohttp session, verified TLS, streamed bodies, curl-style --resolve; GETs
without a body go through the lean client (``h1client``) on the same TLS context and --resolve map.

Connections are shared out per class (paced, exempt, passthrough) so that long downloads of one class
cannot take every connection from the others; a wait for a free connection of one's own class is a local
limit (``PoolFull``), never an upstream throttle.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping
from functools import lru_cache

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver, ResolveResult
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from politeproxy.policy import settings as defaults
from politeproxy.proxy.aiohttp_seams import connection_parts
from politeproxy.proxy.fastnet import NO_CLOSE_NOTIFY, close_notify_missing, tls_object
from politeproxy.proxy.h1client import H1Client
from politeproxy.proxy.h1conn import LOCAL_FIX, H1Answer, UpstreamFailed, length_unknown
from politeproxy.proxy.unasked import CheckedConnector

# RFC 9110 7.6.1 and the proxy-only fields: never forwarded in either direction.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Proxy-Connection",
        "Keep-Alive",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Authenticate",
    )
)
CHUNK = 256 * 1024  # measured: bulk throughput +19-49% over 64 KiB, peak RSS +2 MiB
POOLS = ("paced", "exempt", "passthrough")
HEADROOM = 8  # connections beyond the class shares, for robots.txt fetches (at most one per host at a time)
NO_BODY_STATUS = frozenset({204, 304})


def pool_shares(total: int) -> dict[str, int]:
    """Per-class connection limits out of ``[upstream] max_connections``: a quarter each for exempt reads and
    passthrough traffic, the rest (at least half) for paced requests; each class at least one."""
    q = max(1, total // 4)
    return {"paced": max(1, total - 2 * q), "exempt": q, "passthrough": q}


class PoolFull(Exception):
    """No connection of the request's class came free in time: a local limit, not an upstream answer."""

    def __init__(self, pool: str, limit: int) -> None:
        super().__init__(f"all {limit} upstream connections for {pool} requests are in use")
        self.pool = pool
        self.limit = limit


_URL_QUERY = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)[?#][^\s'\"]*")


def loggable(text: object, limit: int = 300) -> str:
    """Text for the logs: one line, bounded, and every URL in it without its query (presigned S3 URLs
    carry their signature and credential there). Works on a URL and on an exception message alike.

    Whitespace runs become one space; every other character that is not printable is dropped: C0 and C1
    controls, and Unicode format characters (category Cf: bidi overrides such as U+202E, zero-width
    characters), which make a terminal show a line as something it is not (issue 42, item 8)."""
    flat = " ".join(str(text).split())
    if not flat.isprintable():
        flat = "".join(c for c in flat if c.isprintable())
    return _URL_QUERY.sub(r"\1", flat)[:limit]


Answer = aiohttp.ClientResponse | H1Answer  # what an exchange yields: aiohttp's, or the lean client's


def close_delimited(resp: Answer, method: str) -> bool:
    """The body ends only when the upstream closes: no Content-Length, not chunked (RFC 9112 6.3 rule 8)."""
    if method == "HEAD" or resp.status < 200 or resp.status in NO_BODY_STATUS:
        return False
    return length_unknown(resp.headers)


def describe_error(e: BaseException, url: URL) -> tuple[int, str, str]:
    """The status, one-line reason and local cause of a failed upstream exchange (no response head).

    The local cause is a ``LOCAL_FIX`` key when the failure is this proxy's (our trust store, DNS, an
    address that refused us, a request that cannot be sent), "" when it may be the upstream's; a local one
    ends its reason with the fix."""
    status, message, local = _describe(e, url)
    if local:
        message = f"{message}; {LOCAL_FIX[local]}"
    return status, message, local


def _describe(e: BaseException, url: URL) -> tuple[int, str, str]:
    if isinstance(e, UpstreamFailed):  # the lean client's failures carry their status and reason
        return e.status, loggable(e.message), e.local if e.local in LOCAL_FIX else ""
    where = f"{url.host}:{url.port}"
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        return 502, f"cannot resolve {url.host}", "dns"
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return 502, f"TLS to {where} failed: {e.certificate_error}", "tls"
    if isinstance(e, aiohttp.ClientSSLError):
        return 502, f"TLS to {where} failed: {e}", ""
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return 504, f"connecting to {where} timed out", ""
    if isinstance(e, aiohttp.ServerTimeoutError | TimeoutError):
        return 504, f"{where} did not answer in time", ""
    if isinstance(e, aiohttp.ClientConnectorError):
        local = "refused" if e.errno == errno.ECONNREFUSED else ""
        return 502, f"cannot connect to {where}: {e.strerror or e}", local
    return 502, loggable(f"upstream {where} failed: {type(e).__name__}: {e}"), ""


async def body_head(resp: Answer, n: int) -> bytes:
    """Up to ``n`` bytes of the body's start, left in place for the relay (the lean client's answers);
    b"" for aiohttp's, whose reader offers no peek (HEAD and requests with a body: the head decides)."""
    if isinstance(resp, H1Answer):
        return await resp.peek(n)
    return b""


class EndWatch:
    """Tells a clean end of a close-delimited body from a cut one.

    aiohttp ends such a body without an error however the connection ended. A TCP reset reaches the
    protocol's ``closed`` future as an exception; a TLS close without close_notify leaves the TLS object
    without a received shutdown, so a read on it says "want read" instead of "zero return". Both are probed
    after the body's end, when no application data can be left. Create it before reading the body.

    A TLS transport without a readable ``SSLObject`` (aiofastnet's) is watched instead: every TLS transport
    calls the protocol's ``eof_received`` on a close_notify, and never on a bare TCP close.
    """

    __slots__ = ("closed", "notified", "tls")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        proto, self.closed, tr = connection_parts(resp)  # aiohttp_seams, internal 8
        self.tls = tls_object(tr) if tr is not None else None
        self.notified: list[bool] | None = None
        if self.tls is not None and not hasattr(self.tls, "read") and proto is not None:
            self.notified = _watch_close_notify(proto)

    def cut(self) -> str | None:
        """Why the body was cut short, or None when the upstream closed cleanly."""
        if self.closed is not None:
            if not self.closed.done():
                return None if self.tls is None else self._tls()
            if self.closed.exception() is not None:
                return "connection reset"
        return None if self.tls is None else self._tls()

    def _tls(self) -> str | None:
        if self.notified is not None:
            return None if self.notified[0] else NO_CLOSE_NOTIFY
        return close_notify_missing(self.tls)


def _watch_close_notify(proto: asyncio.Protocol) -> list[bool]:
    """A flag set when ``proto`` hears a clean TLS close (its ``eof_received``): hooked on this one
    protocol only, whose connection ends with the body (close-delimited: never pooled again)."""
    seen = [False]
    original = proto.eof_received

    def eof_received() -> bool | None:
        seen[0] = True
        return original()

    proto.eof_received = eof_received  # type: ignore[method-assign]  # this one instance only
    return seen


def strip_hop_by_hop(
    headers: Mapping[str, str] | CIMultiDictProxy[str], drop: tuple[str, ...] = ()
) -> CIMultiDict[str]:
    """Copy headers without hop-by-hop fields, those named in Connection, and ``drop``."""
    conn = headers.getall("Connection", ()) if isinstance(headers, CIMultiDictProxy | CIMultiDict) else ()
    skip = _skip_set(drop)
    if conn:  # rare: most clients and servers send no Connection header, or keep-alive only
        named = {n.strip().lower() for value in conn for n in value.split(",")}
        skip = skip | (named - {""})
    out: CIMultiDict[str] = CIMultiDict()
    add = out.add
    for k, v in headers.items():
        if k.lower() not in skip:
            add(k, v)
    return out


@lru_cache(maxsize=32)  # the callers pass a few constant tuples: each set is built once
def _skip_set(drop: tuple[str, ...]) -> frozenset[str]:
    return HOP_BY_HOP | {d.lower() for d in drop}


class MappedResolver(AbstractResolver):
    """Maps ``host:port`` to ``ip:port`` like curl's ``--resolve``; other names go to the system resolver."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping: dict[tuple[str, int], tuple[str, int]] = {}
        for src, dst in mapping.items():
            sh, _, sp = src.rpartition(":")
            dh, _, dp = dst.rpartition(":")
            self.mapping[(sh.lower().strip("[]"), int(sp))] = (dh.strip("[]"), int(dp))
        self.system = aiohttp.ThreadedResolver()

    def lookup(self, host: str, port: int) -> tuple[str, int] | None:
        return self.mapping.get((host.lower(), port))

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        hit = self.lookup(host, port)
        if hit is None:
            return await self.system.resolve(host, port, family)
        ip, p = hit
        fam = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
        return [
            ResolveResult(hostname=host, host=ip, port=p, family=fam, proto=0, flags=socket.AI_NUMERICHOST)
        ]

    async def close(self) -> None:
        await self.system.close()


def client_ssl_context(ca_file: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    return ctx


class Upstream:
    """One pooled session for every forwarded request."""

    def __init__(
        self,
        resolve: Mapping[str, str],
        ca_file: str = "",
        connect_timeout: float = defaults.CONNECT_TIMEOUT,
        read_timeout: float = defaults.READ_TIMEOUT,
        max_connections: int = defaults.UPSTREAM_MAX_CONNECTIONS,
    ) -> None:
        self.resolver = MappedResolver(resolve)
        self.ssl = client_ssl_context(ca_file)
        # sock_connect bounds TCP + TLS; connect (pool wait + connect) only matters for the unshared
        # headroom, since the class gates below keep the connector itself from ever being full.
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=2 * connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self.connect_timeout = connect_timeout
        self.limits = pool_shares(max_connections)
        self.gates = {k: asyncio.Semaphore(v) for k, v in self.limits.items()}
        connector = CheckedConnector(
            resolver=self.resolver,
            ssl=self.ssl,
            limit=sum(self.limits.values()) + HEADROOM,
            limit_per_host=0,
            ttl_dns_cache=60,
            enable_cleanup_closed=False,
            keepalive_timeout=30,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            auto_decompress=False,  # bytes pass unchanged: Content-Encoding and Content-Length survive
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            trust_env=False,
            read_bufsize=CHUNK,
        )
        # GETs without a body (the hot case: range reads, WARC and index fetches) take the lean client
        self.h1 = H1Client(
            self.ssl,
            self.resolver.lookup,
            connect_timeout,
            read_timeout,
            max_idle=sum(self.limits.values()) + HEADROOM,
            high_water=2 * CHUNK,  # as aiohttp's reader with read_bufsize=CHUNK
        )

    def request(
        self,
        method: str,
        url: str | URL,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | None,
    ) -> Awaitable[aiohttp.ClientResponse]:
        # A plain function returning aiohttp's awaitable: no coroutine frame of ours to resume while it waits.
        return self.session.request(
            method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            compress=None,
            chunked=None,
            expect100=False,
            raise_for_status=False,
        )

    def exchange(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | None,
        pool: str,
        pool_wait: float,
    ) -> Exchange:
        """One upstream exchange on a connection of ``pool``'s share; the response is released (read to
        its end) or closed (anything else: error, cut, cancellation) on every path out.

        Raises PoolFull (on entering) when no connection of the class came free within ``pool_wait`` seconds.
        """
        return Exchange(self, (method, url, headers, body), pool, pool_wait)

    def tunnel_address(self, host: str, port: int) -> tuple[str, int]:
        """Where a blind tunnel to ``host:port`` should connect (the --resolve map applies)."""
        hit = self.resolver.lookup(host, port)
        return hit if hit else (host, port)

    async def close(self) -> None:
        self.h1.close()
        await self.session.close()


class Exchange:
    """``Upstream.exchange``'s context. A class rather than an @asynccontextmanager: no generator frames
    between the forwarder and aiohttp while the request waits, and no async-generator registration per
    request (issue 10: the small-GET hot path)."""

    __slots__ = ("_args", "_gate", "_pool", "_pool_wait", "_resp", "_up")
    _resp: Answer  # the lean client's answer for a plain GET, aiohttp's for anything else

    def __init__(
        self,
        up: Upstream,
        args: tuple[str, URL, CIMultiDict[str], AsyncIterator[bytes] | None],
        pool: str,
        pool_wait: float,
    ) -> None:
        self._up, self._args, self._pool, self._pool_wait = up, args, pool, pool_wait
        self._gate = up.gates[pool]

    async def __aenter__(self) -> Answer:
        gate = self._gate
        if gate.locked():  # a free connection is taken at once; only a wait needs a timer (hot path)
            try:
                async with asyncio.timeout(max(0.0, self._pool_wait)):
                    await gate.acquire()
            except TimeoutError:
                raise PoolFull(self._pool, self._up.limits[self._pool]) from None
        else:
            await gate.acquire()
        try:
            method, url, headers, body = self._args
            if method == "GET" and body is None:
                self._resp = await self._up.h1.get(url, headers)
            else:
                self._resp = await self._up.request(method, url, headers, body)
        except BaseException:
            gate.release()
            raise
        return self._resp

    async def __aexit__(self, *exc: object) -> None:
        resp = self._resp
        try:
            if resp.content.at_eof() and not resp.closed:
                resp.release()
            else:
                resp.close()
        finally:
            self._gate.release()
