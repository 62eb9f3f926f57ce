"""The answer to one request of the upstream client (``h1client``), as its connection (``h1conn``) feeds
it and the relay reads it: the head, then the body streamed ``read(n)`` at a time, buffered up to a
high-water mark (then the socket stops being read until the relay drains it: never a whole body in memory).

Framing is llhttp's (Content-Length or chunked, close-delimited, 1xx, 204 and 304 without a body); the
policy is this module's: a HEAD's answer ends with its head, bytes past an answer's end make it a failure,
a close before a framed end is a cut. Untrusted bytes never raise out of here: every failure is an
``UpstreamFailed`` with the status the client gets.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

MAX_HEAD = 64 * 1024  # bytes of one answer head (a whole head, not one line, is bounded)
MAX_FIELDS = 256  # header lines of one answer head
NO_FIELDS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())  # read-only: one for every answer


def length_unknown(headers: CIMultiDictProxy[str]) -> bool:
    """No Content-Length and not chunked: a body with one ends only when the connection does (RFC 9112 6.3
    rule 8). ``upstream.close_delimited`` asks this too, with the method and status that have no body."""
    te = ",".join(headers.getall("Transfer-Encoding", ())).lower()
    return "Content-Length" not in headers and "chunked" not in te


# Failures on this side (issue 24): the upstream never saw the request, so they say nothing about it and
# record nothing. Each names its cause and its fix, in the 502's body and the log line.
LOCAL_FIX = {
    "tls": "this proxy does not trust the upstream's certificate (a local set-up problem, not the upstream's "
    "answer): add the CA that signed it with [upstream] ca_file or --upstream-ca FILE",
    "dns": "a local DNS failure, not the upstream's answer: check this machine's resolver, or map the name "
    "with [upstream] resolve",
    "refused": "the resolved address refused the connection (a local set-up problem, not the upstream's "
    "answer): check [upstream] resolve, the network and any firewall",
    "request": "the request cannot be sent as it is (not the upstream's answer)",
}


class UpstreamFailed(Exception):
    """An exchange that failed, with the status the client gets and a one-line reason."""

    def __init__(self, status: int, message: str, *, gone: bool = False, local: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.gone = gone  # the connection closed before any byte of an answer (a reused one: try again)
        self.local = local  # a LOCAL_FIX key: the failure is this proxy's, not the upstream's


class Link(Protocol):
    """What an answer needs of its connection (``h1conn.H1Conn``, which imports this module)."""

    transport: asyncio.Transport | None
    where: str
    reused: bool

    def http_version(self) -> str: ...

    def abort(self) -> None: ...

    def done_with(self, reuse: bool, head_only: bool) -> None: ...

    def drop(self) -> None: ...


class H1Answer:
    """The answer to one request, what ``upstream.Answer`` names: ``status``, ``reason``, ``headers`` and
    ``url``, then the body through ``read(n)`` (``peek(n)`` leaves its start in place; ``content`` is the
    answer itself, for readers written against a client response's shape), and ``release`` or ``close``
    when done."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_error",
        "_head_bytes",
        "head_seen",
        "_high",
        "_paused",
        "_raw",
        "_read_timeout",
        "_waiter",
        "closed",
        "complete",
        "conn",
        "cut_reason",
        "head_only",
        "headers",
        "keep_alive",
        "reason",
        "reason_raw",
        "status",
        "url",
        "writer",
    )

    def __init__(
        self, conn: Link, url: URL, read_timeout: float, high_water: int, head_only: bool = False
    ) -> None:
        self.conn = conn
        self.head_only = head_only  # a HEAD's answer: no body whatever its head says (RFC 9110 9.3.2)
        self.writer: asyncio.Task[None] | None = None  # the request body still being sent
        self.url = url
        self.status = 0
        self.reason = ""
        self.reason_raw = b""
        self.headers: CIMultiDictProxy[str] = NO_FIELDS  # until the head is in
        self._raw: list[tuple[str, str]] = []
        self._head_bytes = 0
        self.head_seen = 0  # bytes read while no answer head was complete (1xx answers included)
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._high = high_water
        self._paused = False
        self._error: UpstreamFailed | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._read_timeout = read_timeout
        self.complete = False  # the whole answer arrived (or ended cleanly with the connection)
        self.keep_alive = False
        self.cut_reason: str | None = None
        self.closed = False

    # fed by the connection
    def header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD or len(self._raw) >= MAX_FIELDS:
            raise UpstreamFailed(502, f"answer head over {MAX_HEAD} bytes or {MAX_FIELDS} fields")
        # UTF-8 with surrogates for other bytes, so the headers pass on unchanged
        self._raw.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def head_done(self, status: int) -> None:
        if status < 200:  # 100 Continue, 103 Early Hints: not the answer; the next head is
            if status == 101:
                raise UpstreamFailed(502, "switched protocols, which this proxy never asked for")
            self._raw.clear()
            self.reason_raw = b""
            return
        self.status = status
        self.reason = self.reason_raw.decode("latin-1")
        self.headers = CIMultiDictProxy(CIMultiDict(self._raw))
        if self.head_only:  # llhttp would read the body the head announces: the answer ends here
            self.complete = True
            self.keep_alive = _keeps_alive(self.conn.http_version(), self.headers)
        self.wake()

    def feed(self, body: bytes) -> None:
        if self.complete:  # a HEAD's answer with a body after its head: bytes nobody asked for
            raise UpstreamFailed(502, "a body after the answer to a HEAD")
        self._chunks.append(body)
        self._buffered += len(body)
        self.wake()
        if self._buffered > self._high and not self._paused and self.conn.transport is not None:
            self._paused = True
            self.conn.transport.pause_reading()

    def message_complete(self, keep_alive: bool) -> None:
        if (
            self.head_only
            and self.complete
            and "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        ):
            # llhttp ends a chunked body only on its last chunk: after a HEAD's head, bytes nobody asked for
            raise UpstreamFailed(502, "a body after the answer to a HEAD")
        if self.status and not self.complete:  # an interim 1xx completes as a message of its own
            self.complete = True
            self.keep_alive = keep_alive
            self.wake()

    def ended(self, cut: str | None) -> None:
        """The connection ended: a clean end of a close-delimited body, a cut, or no answer at all."""
        if self.complete:
            return
        if not self.status:
            self.fail(UpstreamFailed(502, f"upstream {self.conn.where} closed without answering", gone=True))
        elif cut is not None or not length_unknown(self.headers):
            self.cut_reason = cut or "connection closed before the answer's end"
            self.fail(UpstreamFailed(502, f"upstream {self.conn.where} cut the answer: {self.cut_reason}"))
        else:
            self.complete = True
            self.wake()

    def overrun(self) -> None:
        """More bytes came than the answer announced (a body over its Content-Length, or an answer nobody
        asked for after it): the answer is no longer complete, what is still buffered is dropped, and the
        reader meets a failure, so the client sees a cut and the cache keeps nothing."""
        if self.complete and not self.closed:
            self.complete = False
            self._chunks.clear()
            self._buffered = 0
            self._error = UpstreamFailed(
                502, f"upstream {self.conn.where} sent more bytes than its answer's length"
            )
            self.wake()

    def fail(self, error: UpstreamFailed) -> None:
        if self._error is None and not self.complete:
            self._error = error
            self.wake()

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # read by the relay
    async def head(self) -> None:
        """Wait for the answer's head; at most read_timeout between two reads of the socket."""
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait("did not answer in time")

    @property
    def content(self) -> H1Answer:
        return self

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    async def read(self, n: int) -> bytes:
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait(f"sent nothing for {self._read_timeout:g}s")
        chunks = self._chunks
        first = chunks[0]
        if len(first) <= n and len(chunks) == 1:
            chunks.clear()
            data = first
        else:
            out, size = [], 0
            while chunks and size < n:
                c = chunks.pop(0)
                if size + len(c) > n:
                    chunks.insert(0, c[n - size :])
                    c = c[: n - size]
                out.append(c)
                size += len(c)
            data = b"".join(out)
        self._buffered -= len(data)
        if self._paused and self._buffered <= self._high // 2 and self.conn.transport is not None:
            self._paused = False
            self.conn.transport.resume_reading()
        return data

    async def peek(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body's start, left in place for ``read`` (the relay streams them on
        unchanged): waits until they arrived, the body ended or failed, or read_timeout passed."""
        while self._buffered < n and not self.complete and self._error is None:
            try:
                await self._wait(f"sent nothing for {self._read_timeout:g}s")
            except UpstreamFailed:
                break  # the relay's read meets the failure
        out, size = [], 0
        for c in self._chunks:
            if size >= n:
                break
            out.append(c[: n - size])
            size += len(out[-1])
        return b"".join(out)

    async def _wait(self, what: str) -> None:
        loop = asyncio.get_running_loop()
        w = self._waiter = loop.create_future()
        timer = loop.call_later(self._read_timeout, _expire, w)
        try:
            await w
        except TimeoutError:
            self.conn.abort()
            raise UpstreamFailed(504, f"{self.conn.where} {what}") from None
        finally:
            timer.cancel()
            self._waiter = None

    def release(self) -> None:
        """Done with a fully read answer: its connection goes back to the pool when it may be reused."""
        if self.closed:
            return
        self.closed = True
        w = self.writer
        if w is not None and not w.done():  # the upstream answered before the body's end
            w.cancel()
            self.conn.drop()
        elif self.complete:
            self.conn.done_with(self.keep_alive and not self._chunks, self.head_only)
        else:
            self.conn.drop()

    def close(self) -> None:
        """Done early (error, cut, client gone): the connection cannot be reused."""
        if not self.closed:
            self.closed = True
            self.conn.drop()
            if self.writer is not None:
                self.writer.cancel()


def _keeps_alive(version: str, headers: CIMultiDictProxy[str]) -> bool:
    """Whether a connection stays open after an answer without a body (what llhttp says of one it frames)."""
    tokens = {t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(",")}
    return "keep-alive" in tokens if version == "1.0" else version == "1.1" and "close" not in tokens


def _expire(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_exception(TimeoutError())
