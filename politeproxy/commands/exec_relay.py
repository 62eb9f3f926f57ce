"""The sockets of `politeproxy exec`: the relay that is the namespace's one way out (its loopback port to a
Unix socket, that socket to the proxy's TCP port), the stub resolver that refuses every lookup, and the
watch on the loopback that notes every other connection tried. Each is an asyncio server; every wait is
bounded and every table is a KeyCounts (exec_records.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from politeproxy.commands.exec_records import Attempt, KeyCounts, attempt, refuse

CONNECT_TIMEOUT = 10.0  # the proxy, or the relay's Unix socket, answers at once or not at all
IDLE_TIMEOUT = 3600.0  # a tunnel quiet this long is closed (the proxy has shorter idle limits of its own)
CHUNK = 1 << 16
MAX_RELAYED = 4096  # connections open through the relay at once; past it, new ones wait in the backlog
DNS_TCP_TIMEOUT = 5.0
PACKET_HOST = 0  # sll_pkttype of a frame arriving on the loopback (each is seen leaving, too)
ETH_P_ALL = 0x0003

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await asyncio.wait_for(src.read(CHUNK), IDLE_TIMEOUT):
            dst.write(data)
            await asyncio.wait_for(dst.drain(), IDLE_TIMEOUT)
        if dst.can_write_eof():
            dst.write_eof()  # half-close: the other direction may still be answering
    except (TimeoutError, OSError):
        dst.close()


class Relay:
    """Accepts connections and joins each to a new one made by ``opener``, byte for byte."""

    def __init__(self, opener: Opener) -> None:
        self.opener = opener
        self.count = 0  # connections relayed (the report's number)
        self.failed = 0  # connections the far side did not take
        self._open = asyncio.Semaphore(MAX_RELAYED)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            # stop_loop cancels a relay still open when COMMAND ends. Ended quietly: Python 3.11's stream
            # server asks a cancelled handler task for its exception, which logs a traceback.
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self._open:
            try:
                far_r, far_w = await asyncio.wait_for(self.opener(), CONNECT_TIMEOUT)
            except (TimeoutError, OSError):
                self.failed += 1
                writer.close()
                return
            self.count += 1
            try:
                await asyncio.gather(_copy(reader, far_w), _copy(far_r, writer))
            finally:
                for w in (writer, far_w):
                    w.close()


def to_tcp(host: str, port: int) -> Opener:
    return lambda: asyncio.open_connection(host.strip("[]"), port)


def to_unix(path: Path) -> Opener:
    return lambda: asyncio.open_unix_connection(str(path))


# --- the stub resolver --------------------------------------------------------------------------------


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, names: KeyCounts) -> None:
        self.names = names
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        name, answer = refuse(data)
        if name is not None:
            self.names.add(name)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)


async def _dns_tcp(names: KeyCounts, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readexactly(2), DNS_TCP_TIMEOUT)
        body = await asyncio.wait_for(reader.readexactly(struct.unpack("!H", head)[0]), DNS_TCP_TIMEOUT)
        name, answer = refuse(body)
        if name is not None:
            names.add(name)
        if answer is not None:
            writer.write(struct.pack("!H", len(answer)) + answer)
            await asyncio.wait_for(writer.drain(), DNS_TCP_TIMEOUT)
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def listening(host: str, port: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket bound (and listening, for TCP) before any thread starts: the command's first try finds it."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(512)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def resolver_sockets() -> list[socket.socket]:
    """Port 53 on every address of the namespace (every address is local there), UDP and TCP, v4 and v6
    where the namespace has IPv6: a program with a resolver of its own (8.8.8.8 written in) is caught as
    well as one reading resolv.conf."""
    socks = [listening("0.0.0.0", 53, socket.SOCK_DGRAM), listening("0.0.0.0", 53)]
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with contextlib.suppress(OSError):  # IPv6 turned off in this kernel
            socks.append(listening("::", 53, kind))
    return socks


async def stub_resolver(
    names: KeyCounts, socks: list[socket.socket]
) -> list[asyncio.BaseTransport | asyncio.Server]:
    """Answers REFUSED on ``socks`` (from resolver_sockets) and notes each name asked."""
    loop = asyncio.get_running_loop()
    held: list[asyncio.BaseTransport | asyncio.Server] = []
    for sock in socks:
        if sock.type == socket.SOCK_DGRAM:
            transport, _ = await loop.create_datagram_endpoint(lambda: _DnsUdp(names), sock=sock)
            held.append(transport)
        else:
            held.append(await asyncio.start_server(lambda r, w: _dns_tcp(names, r, w), sock=sock))
    return held


# --- the watch on the loopback ------------------------------------------------------------------------


class Watch:
    """Every connection opened (TCP SYN) or datagram sent on the namespace's loopback, except to the relay
    and the stub resolver: with every address local and no other interface, that is every try to go
    around the proxy. The kernel refuses them (RST, or ICMP unreachable); this only takes note."""

    def __init__(self, addresses: KeyCounts, relay: str) -> None:
        self.addresses = addresses
        self.relay = f"{relay}/tcp"
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind(("lo", 0))
        self.sock.setblocking(False)

    def start(self) -> None:
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        for _ in range(64):  # a burst is read in turns, so the relay is never starved
            try:
                frame, addr = self.sock.recvfrom(CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if addr[2] != PACKET_HOST:
                continue
            seen = attempt(frame)
            if seen is not None and self._counts(seen):
                self.addresses.add(seen.key)

    def _counts(self, seen: Attempt) -> bool:
        # Not the relay, and not port 53 either way: the stub resolver notes the name, which says more,
        # and its answers go back to the asker's port.
        return seen.key != self.relay and 53 not in (seen.port, seen.source_port)

    def drain(self) -> None:
        """Read what is still queued (the last tries of a command that just ended), then stop."""
        self._readable()
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, timeout: float) -> None:
    """Stop a loop running in ``thread``: its tasks (relays still open) cancelled and awaited, then the loop
    stopped and closed, so nothing is left pending when the process ends."""

    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    with contextlib.suppress(Exception):  # a loop already gone: nothing to cancel
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)
    if not thread.is_alive():
        loop.close()
