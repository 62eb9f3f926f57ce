"""One request read by the one server protocol (h1server.py), and the way back to its client:
a ``clientside.ClientSide``.

The body arrives from the parser into a small buffer (the connection pauses reading above its mark) and
leaves through ``body()``. The answer is framed here: its Content-Length when it has one (never more bytes
than it says; fewer are a cut), chunked to an HTTP/1.1 client otherwise (so a cut can be told as a cut),
close-delimited to HTTP/1.0. The head goes out with the first body chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from multidict import CIMultiDict

from politeproxy.proxy.common.clientside import ClientGone, Own
from politeproxy.proxy.common.passage import add_via

CHUNK = 256 * 1024  # at most this many body bytes per chunk handed upstream
NO_BODY = frozenset({204, 304})
_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date field, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]


class Connection(Protocol):
    """What a request needs of its connection (h1server.H1Server)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...
    @property
    def limits(self) -> _Idle: ...
    async def drain(self) -> None: ...
    def flow(self) -> None: ...


class _Idle(Protocol):
    @property
    def idle(self) -> float: ...


class Served:
    """A request as read (what ``Forwarder.tunneled`` and ``Forwarder.plain`` are given)."""

    __slots__ = (
        "conn", "method", "target", "version", "remote", "headers", "has_body", "keep_alive", "expect",
        "continued", "chunks", "buffered", "complete", "cut", "waiter", "dropping", "head", "head_sent",
        "length", "sent", "chunked", "close", "ended",
    )  # fmt: skip

    def __init__(
        self,
        conn: Connection,
        method: str,
        target: str,
        version: tuple[int, int],
        remote: str,
        headers: CIMultiDict[str],
        keep_alive: bool,
    ) -> None:
        self.conn = conn
        self.method, self.target, self.version, self.remote = method, target, version, remote
        self.headers = headers
        te = ",".join(headers.getall("Transfer-Encoding", ())).lower()
        self.has_body = "chunked" in te or headers.get("Content-Length", "0").strip() not in ("0", "")
        self.keep_alive = keep_alive
        self.expect = self.has_body and headers.get("Expect", "").lower() == "100-continue"
        self.continued = False
        self.chunks: list[bytes] = []  # not a deque: an empty one holds a 528-byte block per held request
        self.buffered = 0
        self.complete = not self.has_body
        self.cut: str | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.dropping = False
        self.head: bytes | None = None  # the answer's head, until it goes out with the first chunk
        self.head_sent = False
        self.length: int | None = None  # the answer's Content-Length; None when chunked or to the close
        self.sent = 0
        self.chunked = False
        self.close = False  # the connection ends after this answer
        self.ended = False

    # -- the request body, from the parser --------------------------------------------------------------

    def fed(self, data: bytes) -> None:
        if self.dropping:
            return
        self.chunks.append(bytes(data))
        self.buffered += len(data)
        self._wake()

    def completed(self) -> None:
        self.complete = True
        self._wake()

    def broke(self, why: str) -> None:
        if not self.complete:
            self.cut = why
            self._wake()

    def discard(self) -> None:
        """The answer is out and the body was not read: what is left of it is read and dropped."""
        self.dropping = True
        self.chunks.clear()
        self.buffered = 0

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            if chunks := self.chunks:
                k, n = 0, 0
                while k < len(chunks) and n < CHUNK:  # one slice, not pop(0) per part: tiny parts stay O(n)
                    n += len(chunks[k])
                    k += 1
                parts = chunks[:k]
                del chunks[:k]
                self.buffered -= n
                self.conn.flow()  # below the mark again: reading resumes
                yield parts[0] if len(parts) == 1 else b"".join(parts)
                continue
            if self.complete:
                return
            if self.cut is not None:
                raise ClientGone(self.cut)
            self.waiter = asyncio.get_running_loop().create_future()
            idle = self.conn.limits.idle
            try:
                await asyncio.wait_for(self.waiter, idle if idle > 0 else None)
            except TimeoutError:
                raise ClientGone(f"no request body bytes for {idle:g}s") from None
            finally:
                self.waiter = None

    # -- the answer ---------------------------------------------------------------------------------

    async def interim(self, data: bytes) -> None:
        t = self.conn.transport
        if t is None or t.is_closing():
            raise ClientGone("the client connection closed")
        if not self.head_sent and self.head is None:
            t.write(data)
            self.continued = True

    def start(self, status: int, reason: str | None, headers: CIMultiDict[str]) -> None:
        """Frame the answer and make its head (sent with the first chunk, or at the end)."""
        v11 = self.version >= (1, 1)
        no_body = self.method == "HEAD" or status < 200 or status in NO_BODY
        if no_body:
            self.length = 0
        elif (cl := headers.get("Content-Length")) is not None and cl.strip().isdigit():
            self.length = int(cl)
        elif v11:
            self.chunked = True
            headers["Transfer-Encoding"] = "chunked"
        else:
            self.close = True  # HTTP/1.0 without a length: the close ends the body
        if self.close or not self.keep_alive:
            self.close = True
            if v11:
                headers["Connection"] = "close"
        elif not v11:
            headers["Connection"] = "keep-alive"
        if "Date" not in headers:
            headers["Date"] = http_date()
        try:
            phrase = reason or HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        lines = [f"HTTP/{self.version[0]}.{self.version[1]} {status} {phrase}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")

    def _transport(self) -> asyncio.Transport:
        t = self.conn.transport
        if t is None or t.is_closing():
            raise ClientGone("the client connection closed")
        return t

    async def write(self, chunk: bytes) -> None:
        t = self._transport()
        if self.length is not None:
            chunk = chunk[: max(0, self.length - self.sent)]  # never more than the head said
        parts = [] if self.head_sent else [self._head()]
        if chunk:
            parts += [b"%x\r\n" % len(chunk), chunk, b"\r\n"] if self.chunked else [chunk]
            self.sent += len(chunk)
        if parts:
            t.writelines(parts)
        await self.conn.drain()

    def _head(self) -> bytes:
        assert self.head is not None, "start() comes first"
        head, self.head, self.head_sent = self.head, None, True
        return head

    async def end(self) -> None:
        t = self._transport()
        if self.length is not None and self.sent < self.length:
            self.abort()  # fewer bytes than the head said: a cut, never a short body presented as whole
            raise ClientGone("the answer ended short of its Content-Length")
        parts = [] if self.head_sent else [self._head()]
        if self.chunked:
            parts.append(b"0\r\n\r\n")
        if parts:
            t.writelines(parts)
        self.ended = True
        await self.conn.drain()

    def abort(self) -> None:
        t = self.conn.transport
        if t is not None:
            t.abort()

    async def answer(self, own: Own) -> None:
        headers = own.head()
        body = own.body
        headers["Content-Length"] = str(len(body))
        add_via(headers)
        if own.close:
            self.close = True
        self.start(own.status, None, headers)
        if self.method != "HEAD":
            await self.write(body)
        await self.end()
