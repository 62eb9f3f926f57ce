"""TLS interception: answer the CONNECT, upgrade the client connection with a leaf for the target.

Bytes the client sent before the upgrade (after its CONNECT head, or a ClientHello the tunnel peeked at)
start the TLS stream: ``loop.start_tls`` would lose them (CPython #142352, uvloop #707), so they are fed
into an ``asyncio.sslproto.SSLProtocol`` before reading resumes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from asyncio import sslproto
from collections.abc import Awaitable, Callable

from politeproxy.proxy.common.responses import BurstLimitedLog, plain_response

log = logging.getLogger("politeproxy")
unsigned = BurstLimitedLog(log)  # paced names the CA may not sign, rate-limited per name


class _LeanSSLProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a 32 KiB read buffer instead of 256 KiB. Its buffer is a zero-filled
    bytearray made per connection, so all of it is resident: 282 KiB per held connection against 57 KiB
    with this one (issue 15). OpenSSL returns at most one 16 KiB record per read, so reads lose nothing;
    a receive takes up to two records per call instead of sixteen."""

    max_size = 32 * 1024


class _Pending(asyncio.Protocol):
    """Holds application bytes that arrive with the end of the TLS handshake until h1server is attached."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # only from start_with (call_connection_made)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True


async def _leaf_context(
    transport: asyncio.Transport,
    client: str,
    host: str,
    port: int,
    context_for: Callable[[str], Awaitable[ssl.SSLContext] | ssl.SSLContext],
    answered: bool,
) -> ssl.SSLContext | None:
    """The server context for ``host``, or None after telling the client why not (while it still
    speaks HTTP: once answered, it is mid-handshake and only the connection's close can tell it)."""
    try:
        got = context_for(host)
        return await got if inspect.isawaitable(got) else got
    except ValueError as e:  # the CA refused the name (ca.NameRefused): the client's doing, one line
        why = f"{e}: add {host} to paced_hosts and restart (a new CA; trust the new ca.pem)"
        if unsigned.allow(host):
            log.warning("%s: CONNECT %s:%d refused, not tunnelled: %s", client, host, port, why)
        if not answered:
            refusal = f"the CA may not sign {host}; see the proxy's log"
            transport.write(plain_response(403, "Forbidden", refusal))
    except Exception as e:  # noqa: BLE001 - a bad leaf must not take the listener down
        log.error("%s: no leaf for %s: %s", client, host, e)
        if not answered:
            transport.write(plain_response(502, "Bad Gateway", f"cannot make a certificate for {host}"))
    transport.close()
    return None


def _feed(proto: asyncio.BufferedProtocol, data: bytes) -> None:
    """Hand ``data`` to a buffered protocol as if the transport had read it."""
    view = memoryview(data)
    while view:
        buf = memoryview(proto.get_buffer(len(view)))  # typed as a read-only Buffer; a writable view
        n = min(len(buf), len(view))
        if n <= 0:
            raise ConnectionError("the TLS layer took no bytes")
        buf[:n] = view[:n]
        proto.buffer_updated(n)
        view = view[n:]


async def start_with(
    transport: asyncio.Transport, pending: _Pending, ctx: ssl.SSLContext, initial: bytes, timeout: float
) -> asyncio.Transport | None:
    """``loop.start_tls(server_side=True)`` for a connection whose first ``initial`` bytes were read
    already: they go into the TLS layer before the transport reads again (reading is paused)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    # typeshed types SSLProtocol's ssl_handshake_timeout int | None; CPython takes float seconds, as start_tls
    within: int | None = timeout  # type: ignore[assignment]
    proto = _LeanSSLProtocol(
        loop, pending, ctx, waiter, server_side=True, call_connection_made=True, ssl_handshake_timeout=within
    )
    transport.pause_reading()
    transport.set_protocol(proto)
    proto.connection_made(transport)  # starts the handshake, which waits for the ClientHello
    _feed(proto, initial)
    transport.resume_reading()
    try:
        await waiter
    except BaseException:
        transport.close()
        raise
    return pending.transport


async def upgrade(
    transport: asyncio.Transport,
    client: str,
    host: str,
    port: int,
    leftover: bytes,
    *,
    context_for: Callable[[str], Awaitable[ssl.SSLContext] | ssl.SSLContext],
    handshake_timeout: float,
    attach: Callable[[asyncio.Transport], asyncio.Protocol],
    answered: bool = False,
) -> None:
    """Answer 200 (unless ``answered``: the tunnel did), run the TLS handshake as the server for
    ``host``, then hand the TLS transport to the protocol ``attach`` returns, with any application bytes
    that came with the end of the handshake. ``leftover``: the client's bytes read so far, the start of
    its TLS stream.

    ``context_for`` is ``CertificateAuthority.context`` (async: signing runs off the loop); a plain
    callable returning a context is still accepted."""
    loop = asyncio.get_running_loop()
    ctx = await _leaf_context(transport, client, host, port, context_for, answered)
    if ctx is None or transport.is_closing():  # refused, or the client left while its leaf was made
        return
    if not answered:
        transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    pending = _Pending()
    try:
        if leftover:
            tls = await start_with(transport, pending, ctx, leftover, handshake_timeout)
        else:
            tls = await loop.start_tls(
                transport, pending, ctx, server_side=True, ssl_handshake_timeout=handshake_timeout
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
    proto = attach(tls)
    tls.set_protocol(proto)
    proto.connection_made(tls)
    if pending.chunks:
        proto.data_received(b"".join(pending.chunks))
    if pending.lost:
        proto.connection_lost(None)
    elif pending.eof:
        proto.eof_received()
