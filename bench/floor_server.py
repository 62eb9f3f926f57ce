"""The floor probe's proxy process (bench/floor_probe.py starts it): the least intercepting proxy.

Reads a ``CONNECT`` head, answers 200, runs ``loop.start_tls(server_side=True)`` with the fake upstream's
leaf for data.commoncrawl.org, parses each request with httptools (llhttp), forwards it over a pooled
keep-alive verified-TLS connection to the fake upstream, parses the answer with httptools and relays it:
head and body in one write for a small answer, and a body past ``STREAM_AT`` as it comes, with the
upstream's reading paused while the client's write buffer is full. No pacing, logs, metrics, store or
timeouts; GET-only, Content-Length bodies. ``GET /hold/...`` holds a request on a future until
``/__release`` (plain HTTP to the probe's port); ``/__held`` counts them. Stops by itself after
``--lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import ssl
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httptools

DATA_HOST = "data.commoncrawl.org"
STREAM_AT = 64 * 1024  # an answer body past this goes to the client as it arrives
HELD: list[asyncio.Future[None]] = []


def raise_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)


# -- the floor probe (the --serve process) --------------------------------------------------------------


class Pool:
    """Keep-alive TLS connections to the upstream, at most ``cap``; callers wait in FIFO order."""

    def __init__(self, port: int, ctx: ssl.SSLContext, cap: int = 64) -> None:
        self.port, self.ctx, self.cap, self.n = port, ctx, cap, 0
        self.idle: list[UpConn] = []
        self.waiting: deque[Callable[[UpConn], None]] = deque()

    def acquire(self, cb: Callable[[UpConn], None]) -> None:
        if self.idle:
            cb(self.idle.pop())
        elif self.n < self.cap:
            self.n += 1
            asyncio.get_running_loop().create_task(self._open(cb))
        else:
            self.waiting.append(cb)

    async def _open(self, cb: Callable[[UpConn], None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(
                lambda: UpConn(self), "127.0.0.1", self.port, ssl=self.ctx, server_hostname=DATA_HOST
            )
        except OSError:
            self.n -= 1
            return
        cb(up)

    def release(self, up: UpConn) -> None:
        if self.waiting:
            self.waiting.popleft()(up)
        else:
            self.idle.append(up)

    def lost(self, up: UpConn) -> None:
        self.n -= 1
        if up in self.idle:
            self.idle.remove(up)


class UpConn(asyncio.Protocol):
    """One upstream connection: send a request head, parse the answer, relay it to the waiting client."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.parser = pool, httptools.HttpResponseParser(self)
        self.client: ClientConn | None = None
        self.reason, self.head, self.body = b"", [], []  # type: tuple[bytes, list[bytes], list[bytes]]
        self.size, self.streaming = 0, False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.lost(self)
        if self.client is not None:
            self.client.transport.close()

    def send(self, client: ClientConn, req: bytes) -> None:
        self.client, client.up = client, self
        self.transport.write(req)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()
        if self.streaming and self.body:
            self._out(b"".join(self.body))
            self.body = []

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.append(b"%s: %s\r\n" % (name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)  # while streaming, written once per read (data_received)
        if self.streaming:
            return
        self.size += len(body)
        if self.size > STREAM_AT:  # a large answer: the head and what came so far, then the rest as it comes
            self.streaming = True
            self._out(self._whole())

    def _whole(self) -> bytes:
        status = self.parser.get_status_code()
        msg = b"HTTP/1.1 %d %s\r\n%s\r\n%s" % (status, self.reason, b"".join(self.head), b"".join(self.body))
        self.head, self.body = [], []
        return msg

    def _out(self, data: bytes) -> None:
        client = self.client
        if client is not None and not client.transport.is_closing():
            client.transport.write(data)  # the client's pause_writing pauses this connection's reading

    def on_message_complete(self) -> None:
        if not self.streaming:
            self._out(self._whole())
        else:  # the client's buffer may have paused this connection in the same read: it goes back idle
            self._out(b"".join(self.body))
            self.body = []
            self.transport.resume_reading()
        client, self.client, self.size, self.streaming = self.client, None, 0, False
        if client is not None:
            client.up = None
        if self.parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.transport.close()


class ClientConn(asyncio.Protocol):
    """A client connection: a CONNECT head in plain text (or /__held, /__release), then HTTPS requests."""

    def __init__(self, pool: Pool, ctx: ssl.SSLContext) -> None:
        self.pool, self.ctx, self.tls = pool, ctx, False
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.head = b"", []  # type: tuple[bytes, list[bytes]]
        self.up: UpConn | None = None  # the upstream connection relaying to this client now

    def pause_writing(self) -> None:
        if self.up is not None:
            self.up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None:
            self.up.transport.resume_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # CONNECT: answer, then terminate TLS on this connection
            self.transport.pause_reading()
            self.transport.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            asyncio.get_running_loop().create_task(self._upgrade())
        except httptools.HttpParserError:
            self.transport.close()

    async def _upgrade(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(self.transport, self, self.ctx, server_side=True)
        except (OSError, ssl.SSLError):
            self.transport.close()
            return
        assert tls is not None
        self.transport, self.tls, self.url = tls, True, b""
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.append(b"%s: %s\r\n" % (name, value))

    def on_message_complete(self) -> None:
        url, head, self.url, self.head = self.url, self.head, b"", []
        if not self.tls:
            return self._control(url) if self.parser.get_method() != b"CONNECT" else None
        req = b"GET %s HTTP/1.1\r\n%s\r\n" % (url, b"".join(head))
        if url.startswith(b"/hold/"):  # the floor of a held request: a future and what it will send
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda _f: self.pool.acquire(lambda up: up.send(self, req[:4] + req[9:])))
            HELD.append(fut)
            return None
        self.pool.acquire(lambda up: up.send(self, req))
        return None

    def _control(self, url: bytes) -> None:
        if url == b"/__release":
            for fut in HELD:
                fut.set_result(None)
            HELD.clear()
        body = b"%d" % len(HELD)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
            len(body), body))  # fmt: skip
        self.transport.close()


async def serve(a: argparse.Namespace) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    server_ctx.set_alpn_protocols(["http/1.1"])
    server_ctx.load_cert_chain(a.cert)
    pool = Pool(a.upstream_port, ssl.create_default_context(cafile=a.ca))
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: ClientConn(pool, server_ctx), "127.0.0.1", 0, backlog=4096)
    await asyncio.to_thread(Path(a.port_file).write_text, str(srv.sockets[0].getsockname()[1]))
    await asyncio.sleep(a.lifetime)  # bounded: the probe stops by itself


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("--port-file", "--ca", "--cert"):
        p.add_argument(k, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--lifetime", type=float, default=600.0)
    a = p.parse_args(argv)
    raise_nofile()
    uvloop.run(serve(a))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
