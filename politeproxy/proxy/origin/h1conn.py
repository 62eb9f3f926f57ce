"""One upstream HTTP/1.1 connection of the upstream client (issue 15; issue 44: every method).

A plain asyncio protocol: it writes request bytes (with ``drain``, the transport's flow control, for a
body) and feeds what httptools (llhttp) parses of the upstream's bytes to the answer being read
(``h1answer``). Bytes nobody asked for end the connection. Untrusted upstream bytes never raise out of
here: a bad head, a head over its bound or a cut turns into an ``UpstreamFailed`` the reader sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from politeproxy.proxy.common.fastnet import NO_CLOSE_NOTIFY, close_notify_missing, tls_object
from politeproxy.proxy.origin.h1answer import (
    LOCAL_FIX,
    MAX_FIELDS,
    MAX_HEAD,
    H1Answer,
    UpstreamFailed,
    length_unknown,
)

# what the client, the upstream side and the tests import from here
__all__ = ["LOCAL_FIX", "MAX_FIELDS", "MAX_HEAD", "H1Answer", "H1Conn", "UpstreamFailed", "length_unknown"]


class H1Conn(asyncio.Protocol):
    """One pooled connection: writes request heads, feeds answer bytes to the answer being read."""

    __slots__ = (
        "answer",
        "drained",
        "pool",
        "eof",
        "idle_since",
        "key",
        "lost",
        "parser",
        "reused",
        "tls",
        "transport",
        "where",
    )

    def __init__(
        self,
        key: tuple[str, str, int],
        where: str,
        tls: bool,
        pool: Callable[[H1Conn], None] | None = None,
    ) -> None:
        self.pool = pool  # takes the connection back when an answer left it reusable
        self.key = key
        self.where = where
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: H1Answer | None = None
        self.eof = False
        self.lost = False
        self.reused = False
        self.idle_since = 0.0
        self.drained: asyncio.Future[None] | None = None  # set while the transport's buffer is full

    async def drain(self, timeout: float) -> None:
        """Wait until the transport takes more (a request body's backpressure), at most ``timeout``."""
        w = self.drained
        if w is not None and not self.lost:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(w)
            except TimeoutError:
                raise UpstreamFailed(504, f"{self.where} took no request bytes for {timeout:g}s") from None
        if self.lost:
            raise UpstreamFailed(502, f"upstream {self.where} closed while the request was sent")

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        w, self.drained = self.drained, None
        if w is not None and not w.done():
            w.set_result(None)

    def http_version(self) -> str:
        return self.parser.get_http_version()

    def done_with(self, reuse: bool, head_only: bool) -> None:
        """The answer read to its end: back to the pool when ``reuse`` and it may be, else closed."""
        self.answer = None
        if reuse and self.pool is not None and self.usable():
            if head_only:  # llhttp still expects the body the HEAD's head announced: start over
                self.parser = httptools.HttpResponseParser(self)
            self.pool(self)
        else:
            self.lost = True
            if self.transport is not None:
                self.transport.close()

    def drop(self) -> None:
        """The answer was given up (unread, cut, or its request body unsent): never reused."""
        self.answer = None
        self.abort()

    def usable(self) -> bool:
        return not (self.lost or self.eof or self.transport is None or self.transport.is_closing())

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        a = self.answer
        if a is None or a.complete:  # bytes nobody asked for: this connection cannot be trusted again
            if a is not None:
                a.overrun()  # past the end of the answer being read: what it still buffers is not served
            self.abort()
            return
        try:
            self.parser.feed_data(data)
            if not a.status:  # still in the head: llhttp keeps a partial line itself, so bound the bytes here
                a.head_seen += len(data)
                if a.head_seen > MAX_HEAD:
                    raise UpstreamFailed(502, f"answer head over {MAX_HEAD} bytes")
                a.wake()  # the read timeout runs between reads, also while a head arrives in pieces
        except Exception as e:  # noqa: BLE001 - llhttp's errors and our bounds: the answer fails, one line
            inner = e.__context__ if isinstance(e.__context__, UpstreamFailed) else e
            reason = inner.message if isinstance(inner, UpstreamFailed) else (str(e) or type(e).__name__)
            if a.complete:  # bytes after the answer's end in the same read: a body over its length
                a.overrun()
            else:
                a.fail(UpstreamFailed(502, f"upstream {self.where} sent a malformed answer: {reason}"))
            self.abort()

    def eof_received(self) -> bool:
        self.eof = True
        if self.answer is not None:
            self.answer.ended(self._tls_cut() if self.tls else None)
        return False

    def _tls_cut(self) -> str | None:
        """asyncio's and uvloop's TLS transports call ``eof_received`` on a bare TCP close too, so their TLS
        object is asked; aiofastnet's offers no readable one and calls it only on a close_notify
        (``upstream.EndWatch`` alike)."""
        obj = tls_object(self.transport) if self.transport is not None else None
        if obj is None or not hasattr(obj, "read"):
            return None
        return close_notify_missing(obj)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.resume_writing()  # a body writer waiting to drain meets the loss
        a = self.answer
        if a is not None and not self.eof:
            if exc is not None:
                a.ended("connection reset")
            elif self.tls:
                a.ended(NO_CLOSE_NOTIFY)
            else:
                a.ended(None)

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.answer.complete:  # type: ignore[union-attr]
            # a second answer in the same read: never asked for, and it must not overwrite the first
            raise UpstreamFailed(502, "bytes after the end of the answer")

    def on_status(self, status: bytes) -> None:
        self.answer.reason_raw += status  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answer.header(name, value)  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        self.answer.head_done(self.parser.get_status_code())  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self.answer.feed(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        a = self.answer
        if a is not None:
            a.message_complete(self.parser.should_keep_alive())
