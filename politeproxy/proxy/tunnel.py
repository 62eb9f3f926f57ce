"""The blind byte tunnel for hosts that are not paced: the proxy never sees their TLS."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from politeproxy.proxy.responses import plain_response

log = logging.getLogger("politeproxy")


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


async def open_tunnel(
    transport: asyncio.Transport,
    client: str,
    host: str,
    port: int,
    leftover: bytes,
    *,
    dest: tuple[str, int],
    connect_timeout: float,
    idle: float,
    on_open: Callable[[int], None],
    on_bytes: Callable[[bool, int], None],
) -> None:
    """Connect to ``dest`` and relay bytes both ways; ``on_open(+1/-1)`` tracks open tunnels."""
    loop = asyncio.get_running_loop()
    dest_host, dest_port = dest
    pair = _RelayPair(idle, lambda: on_open(-1), on_bytes)
    try:
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(lambda: pair.upstream, dest_host, dest_port)
    except (OSError, TimeoutError) as e:
        pair.timer.cancel()
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        log.info("%s: CONNECT %s:%d failed: %s", client, host, port, why)
        status, reason = (504, "Gateway Timeout") if isinstance(e, TimeoutError) else (502, "Bad Gateway")
        transport.write(plain_response(status, reason, f"cannot connect to {host}:{port}: {why}"))
        transport.close()
        return
    on_open(+1)
    transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    transport.set_protocol(pair.client)
    pair.client.connection_made(transport)
    if leftover and pair.upstream.transport:
        pair.upstream.transport.write(leftover)
    transport.resume_reading()
    log.debug("%s: tunnel to %s:%d", client, host, port)
