"""The upstream side: one client of the project's own (``h1client``) for every method, pooled, verified TLS,
bodies streamed both ways, curl-style --resolve.

Connections are shared out per class (paced, exempt, passthrough) so that long downloads of one class
cannot take every connection from the others; a wait for a free connection of one's own class is a local
limit (``PoolFull``), never an upstream throttle.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping
from functools import lru_cache

import certifi
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from politeproxy.policy import settings as defaults
from politeproxy.proxy.origin.h1client import H1Client
from politeproxy.proxy.origin.h1conn import LOCAL_FIX, H1Answer, UpstreamFailed

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


Answer = H1Answer  # what an exchange yields: the answer's head, its body streamed


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
    if isinstance(e, UpstreamFailed):  # the client's failures carry their status and reason
        return e.status, loggable(e.message), e.local if e.local in LOCAL_FIX else ""
    where = f"{url.host}:{url.port}"
    if isinstance(e, TimeoutError):
        return 504, f"{where} did not answer in time", ""
    return 502, loggable(f"upstream {where} failed: {type(e).__name__}: {e}"), ""


def strip_hop_by_hop(
    headers: Mapping[str, str] | CIMultiDictProxy[str], drop: tuple[str, ...] = ()
) -> CIMultiDict[str]:
    """Copy headers without hop-by-hop fields, those named in Connection, and ``drop``."""
    conn = headers.getall("Connection", ()) if isinstance(headers, CIMultiDictProxy | CIMultiDict) else ()
    skip = _skip_set(drop)
    if conn:  # rare: most clients and servers send no Connection header, or keep-alive only
        named = {n.strip().lower() for value in conn for n in value.split(",")}
        skip = skip | (named - {""})
    # a copy in C, then each unwanted name taken out: cheaper than a Python loop over every field
    out: CIMultiDict[str] = CIMultiDict(headers)
    for name in skip:
        if name in out:
            del out[name]
    return out


@lru_cache(maxsize=32)  # the callers pass a few constant tuples: each set is built once
def _skip_set(drop: tuple[str, ...]) -> frozenset[str]:
    return HOP_BY_HOP | {d.lower() for d in drop}


class MappedResolver:
    """Maps ``host:port`` to ``ip:port`` like curl's ``--resolve``; other names go to the system resolver
    (the client's own DNS cache, ``h1client``)."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping: dict[tuple[str, int], tuple[str, int]] = {}
        for src, dst in mapping.items():
            sh, _, sp = src.rpartition(":")
            dh, _, dp = dst.rpartition(":")
            self.mapping[(sh.lower().strip("[]"), int(sp))] = (dh.strip("[]"), int(dp))

    def lookup(self, host: str, port: int) -> tuple[str, int] | None:
        return self.mapping.get((host.lower(), port))


def client_ssl_context(ca_file: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    return ctx


class Upstream:
    """One pooled client for every forwarded request: connections are kept per (scheme, host, port) for
    30 s, names resolved once a minute, addresses tried by happy eyeballs (``h1client``). In use at once:
    each class at most its share of ``max_connections`` (``gates``), and robots.txt fetches."""

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
        self.connect_timeout = connect_timeout
        self.limits = pool_shares(max_connections)
        self.gates = {k: asyncio.Semaphore(v) for k, v in self.limits.items()}
        self.h1 = H1Client(
            self.ssl,
            self.resolver.lookup,
            connect_timeout,
            read_timeout,
            max_idle=sum(self.limits.values()) + HEADROOM,
            high_water=2 * CHUNK,  # two reads of the relay's: the socket pauses beyond
        )

    def request(
        self,
        method: str,
        url: str | URL,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | None,
    ) -> Awaitable[H1Answer]:
        """One exchange outside the classes' shares: robots.txt, at most ``robots_fetch.MAX_FETCHES`` at
        once (within HEADROOM). The caller closes the answer."""
        return self.h1.request(method, url if isinstance(url, URL) else URL(url), headers, body)

    def exchange(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | None,
        pool: str,
        pool_wait: float,
    ) -> UpstreamCall:
        """One upstream exchange on a connection of ``pool``'s share; the response is released (read to
        its end) or closed (anything else: error, cut, cancellation) on every path out.

        Raises PoolFull (on entering) when no connection of the class came free within ``pool_wait`` seconds.
        """
        return UpstreamCall(self, (method, url, headers, body), pool, pool_wait)

    def tunnel_address(self, host: str, port: int) -> tuple[str, int]:
        """Where a blind tunnel to ``host:port`` should connect (the --resolve map applies)."""
        hit = self.resolver.lookup(host, port)
        return hit if hit else (host, port)

    async def close(self) -> None:
        self.h1.close()


class UpstreamCall:
    """``Upstream.exchange``'s context. A class rather than an @asynccontextmanager: no generator frames
    between the forwarder and the client while the request waits, and no async-generator registration per
    request (issue 10: the small-GET hot path)."""

    __slots__ = ("_args", "_gate", "_pool", "_pool_wait", "_resp", "_up")
    _resp: Answer

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
            self._resp = await self._up.h1.request(*self._args)
        except BaseException:
            gate.release()
            raise
        return self._resp

    async def __aexit__(self, *exc: object) -> None:
        resp = self._resp
        try:
            if resp.at_eof() and not resp.closed:
                resp.release()
            else:
                resp.close()
        finally:
            self._gate.release()
