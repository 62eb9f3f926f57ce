"""A raw upstream for the lean client's tests (tests/unit/test_h1client_*.py): a server on 127.0.0.1 that
writes the exact bytes a test chooses, and the helpers and fixtures those tests share."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import trustme
from multidict import CIMultiDict

from politeproxy.proxy.origin.h1client import QUIET, H1Client
from politeproxy.proxy.origin.h1conn import MAX_FIELDS, MAX_HEAD, H1Answer, UpstreamFailed

H = "data.commoncrawl.org"
WHERE = f"{H}:80"
OVER_HEAD = f"answer head over {MAX_HEAD} bytes or {MAX_FIELDS} fields"
T = TypeVar("T")


# --- a raw upstream ---------------------------------------------------------------------------------------


class Peer:
    """One accepted connection of a ``RawServer``, as its handler sees it."""

    def __init__(self, server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.index = server.accepted  # 1 for the first connection the server accepted

    async def head(self) -> bytes:
        """The next request head, or b"" when the client closed the connection."""
        try:
            data = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""
        self.server.heads.append(data)
        return data

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def hang(self) -> None:
        """Stay silent until the client closes the connection (or the test ends and aborts it)."""
        await self.reader.read()

    def reset(self) -> None:
        """Close with a TCP RST: a plain close (abort included) sends a FIN when nothing is left unread."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Handler = Callable[[Peer], Awaitable[None]]


class RawServer:
    """A 127.0.0.1 server running ``handler`` per connection; counts connections and keeps request heads."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.accepted = 0
        self.finished = 0  # handlers that returned (the connection ended on the server's side)
        self.heads: list[bytes] = []
        self.errors: list[BaseException] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.append(writer)
        try:
            await self.handler(Peer(self, reader, writer))
        except (ConnectionError, ssl.SSLError):
            pass  # the client went away: what the client saw is the test's question, not this
        except Exception as e:  # noqa: BLE001 - a broken handler fails the test at exit, not in a log
            self.errors.append(e)
        finally:
            self.finished += 1
            writer.close()

    async def wait_finished(self, n: int, timeout: float = 2.0) -> None:
        async with asyncio.timeout(timeout):
            while self.finished < n:
                await asyncio.sleep(0.01)

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=1.0)
            for t in late:
                t.cancel()
        async with asyncio.timeout(2):
            await self.server.wait_closed()
        if self.errors and exc[0] is None:
            raise self.errors[0]


def answering(*answers: bytes) -> Handler:
    """Answer each request head on the connection with the next of ``answers`` (the last one repeats)."""

    async def handle(peer: Peer) -> None:
        i = 0
        while await peer.head():
            await peer.send(answers[min(i, len(answers) - 1)])
            i += 1

    return handle


def ok(body: bytes = b"hello", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


# --- the client -------------------------------------------------------------------------------------------


def to(port: int) -> Callable[[str, int], tuple[str, int] | None]:
    """The --resolve map: every name goes to the test's server."""
    return lambda host, p: ("127.0.0.1", port)


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., H1Client]]:
    made: list[H1Client] = []

    def make(
        lookup: Callable[[str, int], tuple[str, int] | None],
        *,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 0.5,
        read_timeout: float = 0.5,
        max_idle: int = 8,
        high_water: int = 512 * 1024,
    ) -> H1Client:
        c = H1Client(
            tls or ssl.create_default_context(), lookup, connect_timeout, read_timeout, max_idle, high_water
        )
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
    await asyncio.sleep(0.01)  # aborted transports report connection_lost while the loop still runs


def headers(**kw: str) -> CIMultiDict[str]:
    return CIMultiDict({k.replace("_", "-"): v for k, v in kw.items()})


async def past_quiet() -> None:
    """Wait until a connection just given back is past the client's quiet time: the next request then takes
    it at once, and the pool opens no second one beside a wait (h1client's ``_grow``)."""
    await asyncio.sleep(2 * QUIET)


async def read_all(answer: H1Answer, n: int = 65536) -> bytes:
    out = []
    async with asyncio.timeout(5):
        while chunk := await answer.content.read(n):
            out.append(chunk)
    return b"".join(out)


async def read_until_failure(answer: H1Answer) -> tuple[bytes, UpstreamFailed]:
    """The bytes delivered before the read failed, and the failure (the test fails if none comes)."""
    out = []
    async with asyncio.timeout(5):
        while True:
            try:
                chunk = await answer.content.read(65536)
            except UpstreamFailed as e:
                return b"".join(out), e
            assert chunk, f"the body ended cleanly after {sum(map(len, out))} bytes; a failure was expected"
            out.append(chunk)


async def failure(coro: Awaitable[Any]) -> UpstreamFailed:
    async with asyncio.timeout(5):
        with pytest.raises(UpstreamFailed) as e:
            await coro
    return e.value


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- TLS --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(H).configure_cert(ctx)
    return ctx


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must not wait (after the connection ended, an answer's head and body are there
    or not): its result, or AssertionError if it waited."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("waited for bytes after the connection ended")
