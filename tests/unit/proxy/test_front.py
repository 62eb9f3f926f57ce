"""The proxy port's connection on the one server protocol (proxy/door/front.py), on a fake transport: its
first head routes a CONNECT (with the bytes after the head), a plain connection is served request after
request, a CONNECT after plain requests is not routed, a half-closed client still gets its answers, and a
ClientHello or a silent client is refused as before."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any
from unittest import mock

from politeproxy.policy.access import Access
from politeproxy.policy.routing import Refusal, Target
from politeproxy.proxy.common.clientside import own
from politeproxy.proxy.common.events import NoProxyEvents
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.door.front import FrontProtocol
from politeproxy.proxy.door.served import Served
from tests.support.fake_client import FakeTransport, answers

D = "data.commoncrawl.org"


class Rejected(NoProxyEvents):
    def __init__(self) -> None:
        self.why: list[str] = []

    def rejected(self, host: str, reason: str) -> None:
        self.why.append(reason)


class Door:
    """What FrontProtocol needs of the listener, recording what each connection became."""

    def __init__(self, header: float = 5.0) -> None:
        self.timeouts = mock.Mock(header=header, idle=60.0, max_header_size=4096, max_connections=10)
        self.access = Access(["0.0.0.0/0"], {})
        self.events = Rejected()
        self.tunnel_ports = frozenset({443})
        self.clients: set[asyncio.Transport] = set()
        self.tasks: list[asyncio.Task[None]] = []
        self.served: list[str] = []
        self.intercepted: list[tuple[Tunnel, bytes]] = []
        self.refused: list[int] = []

    def admit(self, transport: asyncio.Transport) -> bool:
        return True

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))
        return self.tasks[-1]

    def hosts_paced(self, host: str) -> bool:
        return host == D

    async def plain(self, req: Served) -> None:
        self.served.append(f"{req.method} {req.target}")
        body = b"".join([c async for c in req.body()]) if req.has_body else b""
        await req.answer(own(200, f"{req.target} {len(body)}"))

    def report(self, client: str, r: Refusal) -> None:
        self.refused.append(r.status)

    async def intercept(
        self, transport: asyncio.Transport, tunnel: Tunnel, leftover: bytes, answered: bool = False
    ) -> None:
        self.intercepted.append((tunnel, leftover))

    async def tunnel(self, front: FrontProtocol, target: Target, leftover: bytes, who: str) -> None:
        raise AssertionError("not in these tests")


async def open_front(door: Door) -> tuple[FrontProtocol, FakeTransport]:
    front = FrontProtocol(door)
    t = FakeTransport(front, peer="10.1.2.3")
    front.connection_made(t)
    return front, t


async def settle(door: Door) -> None:
    for _ in range(10):
        await asyncio.sleep(0)
    await asyncio.gather(*door.tasks, return_exceptions=True)
    await asyncio.sleep(0)


def plain(path: str, extra: str = "") -> bytes:
    return f"GET http://{D}{path} HTTP/1.1\r\nHost: {D}\r\n{extra}\r\n".encode()


async def test_a_connect_is_routed_with_the_bytes_after_its_head() -> None:
    door = Door()
    front, t = await open_front(door)
    front.data_received(f"CONNECT {D}:443 HTTP/1.1\r\nHost: {D}:443\r\n\r\n".encode() + b"\x16\x03\x01hello")
    await settle(door)
    assert door.intercepted == [(Tunnel("10.1.2.3", D, 443, "10.1.2.3"), b"\x16\x03\x01hello")]
    assert not t.reading and t.out == b"" and not door.served


async def test_a_plain_connection_is_served_request_after_request() -> None:
    door = Door()
    front, t = await open_front(door)
    post = f"POST http://{D}/p HTTP/1.1\r\nHost: {D}\r\nContent-Length: 5\r\n\r\nhello".encode()
    front.data_received(plain("/a") + post)
    await settle(door)
    front.data_received(plain("/b"))
    await settle(door)
    assert door.served == [f"GET http://{D}/a", f"POST http://{D}/p", f"GET http://{D}/b"]
    got = answers(bytes(t.out))
    assert [a.body for a in got] == [
        f"politeproxy: http://{D}{p}\n".encode() for p in ("/a 0", "/p 5", "/b 0")
    ]
    assert not t.closing  # keep-alive, as aiohttp's server kept it


async def test_a_connect_after_a_plain_request_is_answered_as_a_request_then_the_close() -> None:
    door = Door()
    front, t = await open_front(door)
    front.data_received(plain("/a") + f"CONNECT {D}:443 HTTP/1.1\r\nHost: {D}:443\r\n\r\n".encode())
    await settle(door)
    assert not door.intercepted and door.served == [f"GET http://{D}/a", f"CONNECT {D}:443"]
    assert t.closing


async def test_a_half_closed_client_gets_the_answers_it_is_owed_then_the_close() -> None:
    door = Door()
    front, t = await open_front(door)
    front.data_received(plain("/a") + plain("/b"))
    assert front.eof_received() is True  # the transport stays open for the answers
    await settle(door)
    assert len(answers(bytes(t.out))) == 2 and t.closing


async def test_a_half_close_with_nothing_owed_closes() -> None:
    door = Door()
    front, _t = await open_front(door)
    front.data_received(plain("/a")[:20])
    assert front.eof_received() is None and not door.served


async def test_a_client_hello_and_a_silent_client_are_refused_and_counted() -> None:
    door = Door(header=0.02)
    front, t = await open_front(door)
    front.data_received(b"\x16\x03\x01\x02\x00")
    assert answers(bytes(t.out))[0].status == 400 and t.closing
    front2, t2 = await open_front(door)
    await asyncio.sleep(0.05)
    assert answers(bytes(t2.out))[0].status == 408 and t2.closing
    assert door.events.why == ["bad_request", "bad_request"]


async def test_a_malformed_first_head_is_400_and_counted() -> None:
    door = Door()
    front, t = await open_front(door)
    front.data_received(b"GET http://x/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    await settle(door)
    assert [a.status for a in answers(bytes(t.out))] == [400] and door.events.why == ["bad_request"]
