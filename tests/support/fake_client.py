"""Test doubles for the client side of an exchange: a transport that records what a protocol writes (for
proxy/door/h1server.py without a socket), a ClientSide that records its answer (for the forwarder), and a
parser of the answers written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httptools
from multidict import CIMultiDict

from politeproxy.proxy.common.clientside import Own
from politeproxy.proxy.common.passage import add_via


class FakeTransport(asyncio.Transport):
    """Records writes; close and abort tell the protocol on the next loop turn, as a real transport does."""

    def __init__(self, protocol: asyncio.Protocol | None = None, peer: str = "10.0.0.9") -> None:
        super().__init__()
        self.protocol = protocol
        self.out = bytearray()
        self.closing = False
        self.aborted = False
        self.reading = True
        self.peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 40000) if name == "peername" else default

    def write(self, data: Any) -> None:
        assert not self.closing, "written after close"
        self.out += data

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def is_closing(self) -> bool:
        return self.closing

    def _end(self) -> None:
        if not self.closing:
            self.closing = True
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def close(self) -> None:
        self._end()

    def abort(self) -> None:
        self.aborted = True
        self._end()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.body = bytearray()
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode(), value.decode())

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class _Answers:
    def __init__(self) -> None:
        self.all: list[Answer] = []
        self.parser: Any = None

    def on_message_begin(self) -> None:
        self.all.append(Answer())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.all[-1].on_header(name, value)

    def on_headers_complete(self) -> None:
        self.all[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.all[-1].on_body(body)

    def on_message_complete(self) -> None:
        self.all[-1].on_message_complete()


def answers(data: bytes, head_only: int = -1) -> list[Answer]:
    """The answers in ``data`` (a client's view of the bytes written); the last may be incomplete.
    Interim 1xx answers are skipped."""
    a = _Answers()
    a.parser = httptools.HttpResponseParser(a)
    rest = data
    while rest.startswith(b"HTTP/1.1 100"):
        rest = rest.split(b"\r\n\r\n", 1)[1]
    try:
        a.parser.feed_data(rest)
    except httptools.HttpParserError:
        pass
    return a.all


class RecordedSide:
    """A ClientSide that records the answer it is given (the forwarder's unit tests)."""

    def __init__(
        self, method: str, target: str, headers: dict[str, str], remote: str = "10.0.0.9", body: bytes = b""
    ) -> None:
        self.method, self.target, self.remote = method, target, remote
        self.version = (1, 1)
        self.headers: CIMultiDict[str] = CIMultiDict(headers)
        self.has_body = bool(body)
        self._body = body
        self.status = 0
        self.answer_headers: CIMultiDict[str] = CIMultiDict()
        self.out = bytearray()
        self.ended = self.aborted = False
        self.interims: list[bytes] = []

    async def body(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body

    async def interim(self, data: bytes) -> None:
        self.interims.append(data)

    def start(self, status: int, reason: str | None, headers: CIMultiDict[str]) -> None:
        self.status, self.answer_headers = status, headers

    async def write(self, chunk: bytes) -> None:
        self.out += chunk

    async def end(self) -> None:
        self.ended = True

    def abort(self) -> None:
        self.aborted = True

    async def answer(self, own: Own) -> None:
        headers = CIMultiDict(own.headers)
        add_via(headers)
        self.start(own.status, None, headers)
        await self.write(own.body)
        await self.end()
