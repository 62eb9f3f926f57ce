"""A CONNECT bound for the blind tunnel, peeked at first: a ClientHello naming a paced host is intercepted.

The order keeps the tunnel's answers as they were (502/504 when the destination cannot be reached):

    connect to a checked address (the upstream side waits in ``_Held``)
    answer 200, then read the client's first bytes (``_Peek``), bounded in bytes (sni.MAX_HELLO) and time
    SNI names a paced host  -> drop the upstream connection; intercept, the read bytes start the TLS
    anything else           -> relay: the read bytes go upstream first, then both ways as before

The peek ends early when the server speaks first (SSH, SMTP: it cannot be TLS), and a client that sends
nothing is tunnelled when the timeout ends, so nobody is held. No byte read from either side is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from politeproxy.proxy.common.responses import BurstLimitedLog, plain_response
from politeproxy.proxy.door import sni
from politeproxy.proxy.door.tunnel import RelayPair

log = logging.getLogger("politeproxy")
seen = BurstLimitedLog(log)  # "intercepted on its SNI" lines at the default level, per client
closed = BurstLimitedLog(log)  # "closed after the peek" lines: their own budget, never hidden by ``seen``

Intercept = Callable[[asyncio.Transport, str, bytes], Awaitable[None]]  # (transport, name, bytes read)


class _Held(asyncio.Protocol):
    """The upstream side while the client is peeked at: what the server sends first waits here."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.transport:
            self.transport.pause_reading()  # one read at most: the peek ends now
        self.wake()

    def eof_received(self) -> bool:
        self.eof = True
        self.wake()
        return True  # half-close: the relay passes it on

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.wake()


class _Peek(asyncio.Protocol):
    """The client side until its first bytes say what it speaks (``sni.server_name``)."""

    def __init__(self, first: bytes) -> None:
        self.buf = bytearray(first)
        self.done = asyncio.get_running_loop().create_future()
        self.result = sni.MORE
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.buf:
            self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.result = sni.server_name(self.buf)
        if self.result.done:
            self.finish()

    def finish(self) -> None:
        """End the peek (once): the client's reading stays paused until the relay or the TLS takes over."""
        if self.done.done():
            return  # a late wake (the upstream closed after the peek) must not pause a taken-over transport
        if self.transport:
            self.transport.pause_reading()
        self.done.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self.finish()
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.finish()


@dataclass
class PeekingTunnel:
    """How tunnels are opened; ``Proxy`` makes one. ``paced`` says whether a server name is paced."""

    connect_timeout: float
    peek_timeout: float
    idle: float
    paced: Callable[[str], bool]
    on_open: Callable[[int], None]
    on_bytes: Callable[[bool, int], None]
    pairs: set[RelayPair]
    on_refused: Callable[[], None] = lambda: None  # a tunnel closed after the peek (``refuse_blind``)

    async def open(
        self,
        transport: asyncio.Transport,
        client: str,
        where: tuple[str, int],
        leftover: bytes,
        dests: list[tuple[str, int]],
        intercept: Intercept,
        refuse_blind: str | None = None,
    ) -> None:
        """Connect to the first of ``dests`` that answers, answer 200, peek, then relay or intercept.
        ``refuse_blind``: the reason to close, logged, rather than relay (the 200 is sent already)."""
        peek = _Peek(leftover)
        held = _Held(peek.finish)
        up = await self._connect(transport, client, where, dests, held)
        if up is None:
            return
        if transport.is_closing():  # the client left while we connected
            up.close()
            return
        try:
            transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            transport.set_protocol(peek)
            peek.connection_made(transport)  # the bytes sent with the CONNECT may decide already
            if not peek.done.done():
                transport.resume_reading()
            await asyncio.wait({peek.done}, timeout=self.peek_timeout)
            peek.finish()  # a client that sent nothing in time (or a server that spoke first): tunnel
        except BaseException:
            up.abort()
            transport.abort()
            raise
        name = peek.result.name
        if peek.lost:
            up.abort()
            return
        if name is not None and self.paced(name):
            up.abort()
            line = "%s: CONNECT %s:%d names %s in its TLS hello: intercepted"
            seen.info(client, line, client, *where, name)
            await intercept(transport, name, bytes(peek.buf))
            return
        if refuse_blind is not None:
            up.abort()
            transport.close()
            closed.info(client, "%s: CONNECT %s:%d: %s", client, *where, refuse_blind)
            self.on_refused()
            return
        self._relay(transport, client, where, up, held, peek)

    async def _connect(
        self,
        transport: asyncio.Transport,
        client: str,
        where: tuple[str, int],
        dests: list[tuple[str, int]],
        held: _Held,
    ) -> asyncio.Transport | None:
        """The upstream connection (addresses only, never names), or None after answering 502/504."""
        loop = asyncio.get_running_loop()
        host, port = where
        try:
            async with asyncio.timeout(self.connect_timeout):
                err: OSError = OSError(f"no address for {host}")
                for dest_host, dest_port in dests:
                    try:
                        up, _ = await loop.create_connection(lambda: held, dest_host, dest_port)
                        return up
                    except OSError as e:
                        err = e
                raise err
        except (OSError, TimeoutError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            log.info("%s: CONNECT %s:%d failed: %s", client, host, port, why)
            status, reason = (504, "Gateway Timeout") if isinstance(e, TimeoutError) else (502, "Bad Gateway")
            transport.write(plain_response(status, reason, f"cannot connect to {host}:{port}: {why}"))
            transport.close()
            return None

    def _relay(
        self,
        transport: asyncio.Transport,
        client: str,
        where: tuple[str, int],
        up: asyncio.Transport,
        held: _Held,
        peek: _Peek,
    ) -> None:
        """The blind tunnel, started with what each side sent during the peek."""

        def closed() -> None:
            self.pairs.discard(pair)
            self.on_open(-1)

        pair = RelayPair(self.idle, closed, self.on_bytes)
        self.on_open(+1)
        self.pairs.add(pair)
        up.set_protocol(pair.upstream)
        pair.upstream.connection_made(up)
        transport.set_protocol(pair.client)
        pair.client.connection_made(transport)
        if peek.buf:
            pair.client.data_received(bytes(peek.buf))  # the bytes read while peeking go first
        for chunk in held.chunks:
            pair.upstream.data_received(chunk)
        if peek.lost or held.lost:
            pair.close()
            return
        if peek.eof:
            pair.client.eof_received()
        if held.eof:
            pair.upstream.eof_received()
        if not peek.eof:
            transport.resume_reading()
        if not held.eof:
            up.resume_reading()
        log.debug("%s: tunnel to %s:%d", client, *where)
