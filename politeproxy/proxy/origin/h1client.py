"""The upstream client (issue 15; issue 44: the only one): every method, pooled HTTP/1.1 connections.

A general client session builds per request a request object, a connector key and lookup, timer
contexts, a response object and a stream reader; for a small GET that machinery cost more than the
parsing (measured when the proxy had one, issue 15). This client keeps one protocol object per
connection (``h1conn``), parses with httptools
(llhttp), writes a request head in one call and a body after it, streamed (its Content-Length, else
chunked), and keeps idle connections per (scheme, host, port) for ``KEEPALIVE`` seconds. Verified TLS,
the --resolve map, a DNS cache, happy eyeballs, the connect and read timeouts, and an error-to-status
mapping with the local causes named (``UpstreamFailed``, ``LOCAL_FIX``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohappyeyeballs
from aiohappyeyeballs import AddrInfoType
from multidict import CIMultiDict
from yarl import URL

from politeproxy.proxy.origin.h1conn import H1Answer, H1Conn, UpstreamFailed
from politeproxy.proxy.origin.unasked import unread

KEEPALIVE = 30.0  # seconds an idle connection is kept (the pool's keep-alive before issue 44)
DNS_TTL = 60.0  # seconds a system resolver answer is kept (as before issue 44)
DNS_ENTRIES = 256  # names remembered at most; the table is emptied when full
HAPPY_EYEBALLS_DELAY = (
    0.25  # seconds before the next address is tried alongside (RFC 8305's recommended delay)
)
RETRIES_ON_STALE = 3  # reused connections found closed before their answer, tried past in one request
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})  # RFC 9110 9.2.2
NO_LENGTH_NEEDED = frozenset(
    {"GET", "HEAD", "OPTIONS", "TRACE"}
)  # methods that need no "Content-Length: 0" without a body
# Seconds after an answer's end before its connection is written to again (issue 42 item 6). Bytes the
# upstream sends just after an answer may still be on their way when the connection is checked empty, and
# would then arrive after the next request was written, as its answer. A connection quiet for this long is
# taken first; else the request waits out the rest on one, and checks it empty again right before it writes.
# The answer is acknowledged at once when it is done with (TCP_QUICKACK): a sender's Nagle holds a small
# write until its last one is acknowledged, and a delayed ACK (40 ms on Linux) would hold such bytes back
# until the next request's own packet acknowledged it, to arrive right after that request.
# A request that finds no connection quiet yet waits out the rest on one, and the pool opens one more
# beside that wait (``_grow``): at a steady rate the pool so grows until a quiet one is always there.
QUIET = 0.005


class H1Client:
    """Pooled bodiless GETs. ``lookup(host, port)`` is the --resolve map (None: ask the system)."""

    def __init__(
        self,
        tls: ssl.SSLContext,
        lookup: Callable[[str, int], tuple[str, int] | None],
        connect_timeout: float,
        read_timeout: float,
        max_idle: int,
        high_water: int,
    ) -> None:
        self.tls = tls
        self.lookup = lookup
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max(1, max_idle)
        self.high_water = high_water
        self.idle: dict[tuple[str, str, int], list[H1Conn]] = {}
        self.idle_count = 0
        self.dns: dict[tuple[str, int], tuple[float, list[AddrInfoType]]] = {}
        self.sweeper: asyncio.TimerHandle | None = None
        self.closing = False
        self.growing: dict[tuple[str, str, int], asyncio.Task[None]] = {}  # at most one opening per key

    def get(self, url: URL, headers: CIMultiDict[str]) -> Awaitable[H1Answer]:
        return self.request("GET", url, headers, None)

    async def request(
        self, method: str, url: URL, headers: CIMultiDict[str], body: AsyncIterator[bytes] | None
    ) -> H1Answer:
        """Send ``method url`` (and ``body``, streamed) and wait for the answer's head. Raises
        ``UpstreamFailed`` (status and reason)."""
        host, port = url.raw_host or "", url.port or 0
        key = (url.scheme, host, port)
        head, length = _request_head(method, url, host, port, headers, body is not None)
        # a request that may have done something upstream is never sent twice (RFC 9112 9.3.1), nor a body
        retries = RETRIES_ON_STALE if body is None and method in IDEMPOTENT else 0
        for attempt in range(retries + 1):
            conn = await self._reuse(key) or await self._connect(key)
            answer = H1Answer(conn, url, self.read_timeout, self.high_water, method == "HEAD")
            conn.answer = answer
            conn.transport.write(head)  # type: ignore[union-attr]
            if body is not None:
                answer.writer = asyncio.get_running_loop().create_task(
                    _send_body(conn, answer, body, length, self.read_timeout)
                )
            try:
                await answer.head()
            except UpstreamFailed as e:
                answer.close()
                if e.gone and conn.reused and attempt < retries:
                    continue
                raise
            except BaseException:
                answer.close()  # cancelled while waiting: the connection's answer is unread
                raise
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _reuse(self, key: tuple[str, str, int]) -> H1Conn | None:
        """An idle connection to write the next request on, quiet for QUIET since its last answer ended."""
        while (conn := self._take(key)) is not None:
            rest = conn.idle_since + QUIET - time.monotonic()
            if rest <= 0:
                return conn
            self._grow(key)
            try:
                await asyncio.sleep(rest)  # an unasked byte sent just after the answer is still on its way
            except BaseException:
                conn.abort()
                raise
            if conn.usable() and not unread(conn.transport):  # what arrived meanwhile aborted it already
                return conn
            conn.abort()
        return None

    def _grow(self, key: tuple[str, str, int]) -> None:
        """One more connection for ``key``, opened in the background into the idle pool, where it is quiet at
        once (nothing was asked on it). Without it a client that sends its next request as soon as it has
        an answer waits out the quiet time on every request (issue 44: a duckdb scan's reads, 2x its time);
        with it such a request still waits at most as long as before, never for a connect. One opening per
        key at a time, and none while the idle pool is half full."""
        if key in self.growing or self.closing or self.idle_count >= self.max_idle // 2:
            return
        self.growing[key] = asyncio.get_running_loop().create_task(self._grown(key))

    async def _grown(self, key: tuple[str, str, int]) -> None:
        try:
            conn = await self._connect(key)
        except Exception:  # noqa: BLE001 - a failure is the next request's to meet and report, not this one's
            return
        finally:
            self.growing.pop(key, None)
        if self.closing:
            conn.abort()
            return
        self._put(conn)
        conn.idle_since -= QUIET  # never answered: no answer's late bytes to wait for

    def _take(self, key: tuple[str, str, int]) -> H1Conn | None:
        """The newest idle connection quiet for QUIET, else the oldest (the shortest wait); checked."""
        conns = self.idle.get(key)
        now = time.monotonic()
        while conns:
            k = len(conns) - 1
            while k >= 0 and now - conns[k].idle_since < QUIET:
                k -= 1
            conn = conns.pop(max(k, 0))
            self.idle_count -= 1
            # unread: bytes the upstream sent on the idle connection that the loop has not read yet
            if conn.usable() and now - conn.idle_since < KEEPALIVE and not unread(conn.transport):
                conn.reused = True
                return conn
            conn.abort()
        return None

    def _put(self, conn: H1Conn) -> None:
        if self.closing or self.idle_count >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        _ack_now(conn.transport)
        self.idle.setdefault(conn.key, []).append(conn)
        self.idle_count += 1
        if self.sweeper is None:
            self.sweeper = asyncio.get_running_loop().call_later(KEEPALIVE / 2, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for KEEPALIVE seconds or closed by the upstream; forget empty keys."""
        self.sweeper = None
        now = time.monotonic()
        for key in list(self.idle):
            keep = []
            for conn in self.idle[key]:
                if conn.usable() and now - conn.idle_since < KEEPALIVE:
                    keep.append(conn)
                else:
                    conn.abort()
            self.idle_count -= len(self.idle[key]) - len(keep)
            if keep:
                self.idle[key] = keep
            else:
                del self.idle[key]
        if self.idle_count:
            self.sweeper = asyncio.get_running_loop().call_later(KEEPALIVE / 2, self._sweep)

    async def _connect(self, key: tuple[str, str, int]) -> H1Conn:
        scheme, host, port = key
        where = f"{host}:{port}"
        tls = scheme == "https"
        try:
            async with asyncio.timeout(2 * self.connect_timeout):  # resolve + connect, as before issue 44
                addrs = await self._resolve(host, port)
                return await self._open(addrs, key, where, tls)
        except UpstreamFailed:
            raise
        except socket.gaierror:
            raise UpstreamFailed(502, f"cannot resolve {host}", local="dns") from None
        except TimeoutError:
            raise UpstreamFailed(504, f"connecting to {where} timed out") from None

    async def _open(
        self, infos: list[AddrInfoType], key: tuple[str, str, int], where: str, tls: bool
    ) -> H1Conn:
        """TCP to the first address that answers (happy eyeballs, RFC 8305: a blackholed IPv6
        address costs 0.25 s, not the connect timeout), then TLS; both within connect_timeout."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                sock = await aiohappyeyeballs.start_connection(
                    infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1
                )
                try:
                    _, conn = await loop.create_connection(
                        lambda: H1Conn(key, where, tls, self._put),
                        sock=sock,
                        ssl=self.tls if tls else None,
                        server_hostname=key[1] if tls else None,
                    )
                except BaseException:
                    sock.close()
                    raise
            return conn
        except ssl.SSLCertVerificationError as e:  # our trust store lacks the upstream's CA: ours to fix
            raise UpstreamFailed(502, f"TLS to {where} failed: {e.verify_message}", local="tls") from None
        except ssl.SSLError as e:  # a broken handshake: the upstream's doing
            raise UpstreamFailed(502, f"TLS to {where} failed: {e}") from None
        except TimeoutError:
            raise UpstreamFailed(504, f"connecting to {where} timed out") from None
        except OSError as e:  # every address refused or unreachable
            local = "refused" if e.errno == errno.ECONNREFUSED else ""
            raise UpstreamFailed(502, f"cannot connect to {where}: {e.strerror or e}", local=local) from None

    async def _resolve(self, host: str, port: int) -> list[AddrInfoType]:
        hit = self.lookup(host, port)
        if hit is not None:
            ip, p = hit
            v6 = ":" in ip
            sockaddr = (ip, p, 0, 0) if v6 else (ip, p)
            return [
                (
                    socket.AF_INET6 if v6 else socket.AF_INET,
                    socket.SOCK_STREAM,
                    socket.IPPROTO_TCP,
                    "",
                    sockaddr,
                )
            ]
        now = time.monotonic()
        cached = self.dns.get((host, port))
        if cached is not None and now - cached[0] < DNS_TTL:
            return cached[1]
        addrs: list[AddrInfoType] = list(
            await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
        if not addrs:
            raise socket.gaierror(f"no address for {host}")
        if len(self.dns) >= DNS_ENTRIES:
            self.dns.clear()
        self.dns[(host, port)] = (now, addrs)
        return addrs

    def close(self) -> None:
        self.closing = True
        for task in self.growing.values():
            task.cancel()
        self.growing.clear()  # a task cancelled before its first step never reaches its own clean-up
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None
        for conns in self.idle.values():
            for conn in conns:
                conn.abort()
        self.idle.clear()
        self.idle_count = 0


def _ack_now(transport: asyncio.BaseTransport | None) -> None:
    """Acknowledge what was read now (Linux's TCP_QUICKACK; elsewhere nothing): see QUIET."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and QUICKACK is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        except (OSError, ValueError, AttributeError):
            pass  # a socket that takes no options: the quiet time alone


QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _request_head(
    method: str, url: URL, host: str, port: int, headers: CIMultiDict[str], has_body: bool
) -> tuple[bytes, int]:
    """The head's bytes, with Host from the URL (port only when not the default) and the body's framing
    (a body without a length goes chunked; a method that may carry one says 0 without, as before issue 44);
    and the body's length, -1 for chunked."""
    netloc = f"[{host}]" if ":" in host else host
    if not url.is_default_port():
        netloc = f"{netloc}:{port}"
    lines = [f"{method} {url.raw_path_qs or '/'} HTTP/1.1", f"Host: {netloc}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    length = 0
    if has_body or method not in NO_LENGTH_NEEDED:
        cl = headers.get("Content-Length")
        if cl is None:
            length = -1 if has_body else 0
            lines.append("Transfer-Encoding: chunked" if has_body else "Content-Length: 0")
        elif cl.isdigit():  # the client side's parser checked it; a second look costs nothing here
            length = int(cl)
        else:
            raise UpstreamFailed(400, "the request's Content-Length is not a number", local="request")
    text = "\r\n".join(lines)
    # every field came through a parser that refuses CR and LF in it; a second look costs one scan
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
        raise UpstreamFailed(400, "a header value holds a line break", local="request")
    return (text + "\r\n\r\n").encode("utf-8", "surrogateescape"), length


async def _send_body(
    conn: H1Conn, answer: H1Answer, body: AsyncIterator[bytes], length: int, timeout: float
) -> None:
    """Stream the request body after its head: ``length`` bytes, or chunked when -1; never more than one
    chunk held here (``drain`` waits while the upstream reads slower than the client sends).

    A body that breaks (the client left) or a connection that cannot take it fails the answer and ends
    the connection: the upstream must not take a short body for a whole one."""
    transport = conn.transport
    assert transport is not None
    sent = 0
    try:
        async for chunk in body:
            if not chunk:
                continue
            sent += len(chunk)
            if length < 0:
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            elif sent > length:
                raise UpstreamFailed(
                    400, "the request body is longer than its Content-Length", local="request"
                )
            else:
                transport.write(chunk)
            await conn.drain(timeout)
        if length < 0:
            transport.write(b"0\r\n\r\n")
        elif sent != length:
            raise UpstreamFailed(400, "the request body ended before its Content-Length", local="request")
    except UpstreamFailed as e:
        answer.fail(e)
        conn.abort()
    except Exception as e:  # noqa: BLE001 - the client's body broke: its own side notes it (forward.py)
        answer.fail(UpstreamFailed(502, f"the request body broke: {type(e).__name__}: {e}"))
        conn.abort()
