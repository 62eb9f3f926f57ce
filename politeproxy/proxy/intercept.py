"""TLS interception: answer the CONNECT, upgrade the client connection with a leaf for the target."""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable

from politeproxy.proxy.responses import plain_response

log = logging.getLogger("politeproxy")


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


async def _leaf_context(
    transport: asyncio.Transport,
    client: str,
    host: str,
    port: int,
    context_for: Callable[[str], Awaitable[ssl.SSLContext] | ssl.SSLContext],
) -> ssl.SSLContext | None:
    """The server context for ``host``, or None after answering the client why not."""
    try:
        got = context_for(host)
        return await got if inspect.isawaitable(got) else got
    except ValueError as e:  # the CA refused the name (ca.NameRefused): the client's doing, one line
        log.info("%s: CONNECT %s:%d refused: %s", client, host, port, e)
        transport.write(plain_response(403, "Forbidden", "the CA may not sign this name"))
    except Exception as e:  # noqa: BLE001 - a bad leaf must not take the listener down
        log.error("%s: no leaf for %s: %s", client, host, e)
        transport.write(plain_response(502, "Bad Gateway", f"cannot make a certificate for {host}"))
    transport.close()
    return None


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
) -> None:
    """Answer 200, run the TLS handshake as the server for ``host``, then hand the TLS transport to the
    protocol ``attach`` returns, with any application bytes that came with the end of the handshake.

    ``context_for`` is ``CertificateAuthority.context`` (async: signing runs off the loop); a plain
    callable returning a context is still accepted."""
    loop = asyncio.get_running_loop()
    if leftover:
        # TLS bytes sent before our 200 would be lost to start_tls; refuse rather than corrupt.
        log.info("%s: CONNECT %s:%d: data sent before the tunnel was open; closing", client, host, port)
        transport.write(plain_response(400, "Bad Request", "data sent before CONNECT was answered"))
        transport.close()
        return
    ctx = await _leaf_context(transport, client, host, port, context_for)
    if ctx is None or transport.is_closing():  # refused, or the client left while its leaf was made
        return
    transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    pending = _Pending()
    try:
        tls = await loop.start_tls(
            transport,
            pending,
            ctx,
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,
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
