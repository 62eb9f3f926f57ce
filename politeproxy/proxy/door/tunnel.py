"""The blind byte tunnel for hosts that are not paced: the proxy never sees their TLS.

Its destination is resolved once, each address is checked (policy/routing.py), and the tunnel connects
to a checked address, never to the name again: no window for DNS rebinding.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable

from politeproxy.policy.access import is_loopback
from politeproxy.policy.routing import Address, Refusal, Target, Where, check_destination, unmap

log = logging.getLogger("politeproxy")


class _Relay(asyncio.Protocol):
    """One side of a blind byte tunnel; flow control pauses the other side's reading."""

    def __init__(self, pair: RelayPair) -> None:
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


class RelayPair:
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


LOOPBACK: tuple[Address, ...] = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def is_local_address(addr: Address) -> bool:
    """True when ``addr`` is an address of this host: only a local address can be bound to."""
    a = unmap(addr)
    if a.is_loopback or a.is_unspecified:
        return True
    family = socket.AF_INET6 if a.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(a), 0))
    except OSError:
        return False
    return True


async def resolve(target: Target) -> list[Address]:
    """The addresses of ``target`` in resolver order; raises OSError when the name does not resolve.
    ``localhost`` and names under it are loopback by rule (RFC 6761), never looked up: one rule for the
    loopback, written as an address or a name."""
    if target.ip is not None:
        return [target.ip]
    if target.host == "localhost" or target.host.endswith(".localhost"):
        return list(LOOPBACK)
    infos = await asyncio.get_running_loop().getaddrinfo(
        target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    addrs: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        a = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if a not in addrs:
            addrs.append(a)
    return addrs


async def destinations(
    target: Target,
    mapped: tuple[str, int] | None,
    check: Callable[[Address, int], Refusal | None],
) -> list[tuple[str, int]] | Refusal:
    """The checked addresses a tunnel to ``target`` may connect to, in resolver order, or the refusal
    of the first one refused when none passes. ``mapped`` (the operator's upstream.resolve) is trusted.
    Raises OSError when the name does not resolve.
    """
    if mapped is not None:
        return [mapped]
    ok: list[tuple[str, int]] = []
    refused: Refusal | None = None
    for a in await resolve(target):
        r = check(a, target.port)
        if r is None:
            ok.append((str(a), target.port))
        elif refused is None:
            refused = r
    return refused if refused is not None and not ok else ok


class Destinations:
    """Where a client's tunnel or request may connect: routing.check_destination with this host's facts
    (its listening ports, its own addresses) and the operator's upstream.resolve map (trusted)."""

    def __init__(
        self,
        allow_private: bool,
        lookup: Callable[[str, int], tuple[str, int] | None],
        timeout: float,
    ) -> None:
        self.allow_private = allow_private
        self.lookup = lookup
        self.timeout = timeout
        self.own_ports: frozenset[int] = frozenset()

    def where(self, client: str) -> Where:
        return Where(is_loopback(client), self.allow_private, self.own_ports)

    def check(self, client: str) -> Callable[[Address, int], Refusal | None]:
        where = self.where(client)
        return lambda a, port: check_destination(a, port, where, is_local=is_local_address(a))

    async def for_tunnel(self, client: str, target: Target) -> list[tuple[str, int]] | Refusal:
        """Checked addresses to connect to; raises OSError or TimeoutError when the name won't resolve."""
        async with asyncio.timeout(self.timeout):
            return await destinations(target, self.lookup(target.host, target.port), self.check(client))

    async def for_request(self, client: str, target: Target) -> Refusal | None:
        """The check for a plain http:// request. The upstream client resolves the name again to connect, so
        a name is refused when any of its addresses is (a rebinding gap remains: see docs/security.md)."""
        where = self.where(client)
        if self.lookup(target.host, target.port) is not None:
            return None
        # A name may skip the lookup only where no answer could refuse it: this proxy's own ports are
        # refused to everyone, written as an address or as a name (localhost:PORT), issue 42 item 4.
        if (
            target.ip is None
            and (where.client_loopback or where.allow_private)
            and target.port not in where.own_ports
        ):
            return None
        try:
            async with asyncio.timeout(self.timeout):
                addrs = await resolve(target)
        except (OSError, TimeoutError):
            return None  # the forwarder answers 502/504 for a name that does not resolve
        check = self.check(client)
        return next((r for r in (check(a, target.port) for a in addrs) if r is not None), None)
