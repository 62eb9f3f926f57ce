"""The client side of one exchange, as the exchange code sees it: read the request's head and body, write
the answer's head, write and drain body chunks, abort.

``served.Served`` implements it: a request read by the one server protocol (h1server.py), on the proxy
port (a plain ``http://`` request, or an admin path) or inside an intercepted tunnel. forward.py, relay.py,
cached.py and flight.py write to a ``ClientSide`` only, so the unit tests hand them a recorded one, and
they never know which connection serves them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from multidict import CIMultiDict

from politeproxy.policy.answers import error_type, proxy_status


class ClientGone(ConnectionError):
    """The client connection ended (or its request body broke) while the exchange read or wrote it."""


class ClientSide(Protocol):
    """One request and the way back to its client."""

    method: str
    target: str  # the request target as it came (origin form inside a tunnel, absolute form on the port)
    version: tuple[int, int]
    remote: str  # the client's address
    headers: CIMultiDict[str]
    has_body: bool  # a Content-Length over 0 or a chunked body

    def body(self) -> AsyncIterator[bytes]:
        """The request body, chunk by chunk (reading is paused while the exchange is slow); ClientGone
        when it is cut."""
        ...

    async def interim(self, data: bytes) -> None:
        """Write ``data`` before the answer's head: an interim ``100 Continue``."""
        ...

    def start(self, status: int, reason: str | None, headers: CIMultiDict[str]) -> None:
        """The answer's head; it goes out with the first body chunk (one send for a small answer)."""
        ...

    async def write(self, chunk: bytes) -> None:
        """One body chunk, waiting while the client reads slowly; ConnectionError when it is gone."""
        ...

    async def end(self) -> None:
        """The answer is whole (a body shorter than its head said is cut instead, never ended)."""
        ...

    def abort(self) -> None:
        """Cut the connection: the client sees a truncated answer, never a short one presented as whole."""
        ...

    async def answer(self, own: Own) -> None:
        """Send one of the proxy's own answers whole."""
        ...


TEXT = "text/plain; charset=utf-8"


@dataclass(slots=True)
class Own:
    """An answer the proxy writes itself: ``politeproxy: <message>`` as text/plain, with Via (``close``:
    the connection cannot go on after it, e.g. a client that still holds back its body). ``error`` is its
    Proxy-Status error type (RFC 9209; "" reads it from the status); ``payload`` and ``content_type``
    replace the text body (S3's XML error for the bucket, ``proxy/forwarding/speak.py``)."""

    status: int
    message: str
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    close: bool = False
    error: str = ""
    payload: bytes | None = None
    content_type: str = TEXT

    def head(self) -> CIMultiDict[str]:
        """Its headers as sent: the content type and Proxy-Status (RFC 9209: this proxy made it, and why)."""
        headers = CIMultiDict(self.headers)
        headers["Content-Type"] = self.content_type
        if "Proxy-Status" not in headers:
            headers["Proxy-Status"] = proxy_status(self.error or error_type(self.status), self.message)
        return headers

    @property
    def body(self) -> bytes:
        if self.payload is not None:
            return self.payload
        return f"politeproxy: {self.message}\n".encode()


def own(status: int, message: str, headers: Mapping[str, str] | None = None, error: str = "") -> Own:
    """One of the proxy's own answers; Via is added when it is written (passage.add_via)."""
    return Own(status, message, CIMultiDict(headers or {}), error=error)
