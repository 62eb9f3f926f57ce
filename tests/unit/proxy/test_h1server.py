"""The intercepted connection's own protocol (proxy/door/h1server.py), on a fake transport: pipelined requests
answered in order, a head split across many reads, bounded heads, flow control both ways, a client that
leaves mid-body, and properties over arbitrary client bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from politeproxy.proxy.common.clientside import ClientGone, own
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.door import h1server
from politeproxy.proxy.door.h1server import H1Server
from politeproxy.proxy.door.served import Served
from tests.support.fake_client import FakeTransport, answers

D = "data.commoncrawl.org"
TUNNEL = Tunnel("10.0.0.9", D, 443, "etl")
TOKEN = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass
class Limits:
    header: float = 15.0
    idle: float = 60.0
    max_header_size: int = 4096


class Conn:
    """One H1Server on a FakeTransport, with a serve that records each request and answers its target."""

    def __init__(self, limits: Limits | None = None, delay: dict[str, float] | None = None) -> None:
        self.served: list[Served] = []
        self.bodies: list[bytes] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.refused: list[int] = []
        self.lost = 0
        self.delay = delay or {}
        self.server = H1Server(TUNNEL, self.serve, limits or Limits(), self.report, self.spawn, self.on_lost)
        self.t = FakeTransport(self.server)
        self.server.connection_made(self.t)

    async def serve(self, req: Served, tunnel: Tunnel) -> None:
        assert tunnel is TUNNEL  # handed over by parameter
        self.served.append(req)
        await asyncio.sleep(self.delay.get(req.target, 0))
        body = b"".join([c async for c in req.body()]) if req.has_body else b""
        self.bodies.append(body)
        await req.answer(own(200, req.target))

    def report(self, client: str, r: object) -> None:
        self.refused.append(getattr(r, "status", 0))

    def spawn(self, coro: object) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self.tasks.append(task)
        return task

    def on_lost(self, _s: H1Server) -> None:
        self.lost += 1

    def feed(self, data: bytes, step: int = 0) -> None:
        for i in range(0, len(data), step or len(data) or 1):
            self.server.data_received(data[i : i + (step or len(data))])

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.sleep(0)


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {D}\r\n{extra}\r\n".encode()


async def test_pipelined_requests_are_answered_in_order_even_when_the_first_is_slowest() -> None:
    c = Conn(delay={"/a": 0.05, "/b": 0.01})
    c.feed(get("/a") + get("/b") + get("/c"))
    await c.settle()
    got = answers(bytes(c.t.out))
    assert [a.body for a in got] == [b"politeproxy: /a\n", b"politeproxy: /b\n", b"politeproxy: /c\n"]
    assert all(a.complete and a.headers["Via"] == "1.1 politeproxy" for a in got)
    assert not c.t.closing  # keep-alive


async def test_a_head_split_across_many_reads_is_one_request() -> None:
    c = Conn()
    c.feed(get("/split?x=1", "X-Long: " + "v" * 300 + "\r\n") + b"POST /p HTTP/1.1\r\nHost: " +
           D.encode() + b"\r\nContent-Length: 5\r\n\r\nhello", step=1)  # fmt: skip
    await c.settle()
    assert [r.target for r in c.served] == ["/split?x=1", "/p"]
    assert c.served[0].headers["X-Long"] == "v" * 300 and c.bodies == [b"", b"hello"]
    assert len(answers(bytes(c.t.out))) == 2


async def test_a_head_over_the_limit_gets_431_and_never_reaches_the_exchange() -> None:
    for step in (0, 7):  # in one read, and across many
        c = Conn(Limits(max_header_size=1024))
        c.feed(get("/ok") + get("/big", "X-Big: " + "b" * 2000 + "\r\n"), step=step)
        await c.settle()
        assert [r.target for r in c.served] == ["/ok"]
        assert [a.status for a in answers(bytes(c.t.out))] == [200, 431] and c.t.closing
        assert c.refused == [431]


async def test_a_malformed_head_is_400_after_the_requests_before_it() -> None:
    for bad in (
        b"GET /x HTTP/1.1\r\n\r\n",
        b"G\x00T / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ):
        c = Conn()
        c.feed(get("/first") + bad + get("/never"))
        await c.settle()
        assert [r.target for r in c.served] == ["/first"]
        assert [a.status for a in answers(bytes(c.t.out))] == [200, 400] and c.t.closing


async def test_a_slow_client_pauses_the_answer_and_a_slow_exchange_pauses_the_client() -> None:
    c = Conn()
    written: list[int] = []
    release = asyncio.Event()

    async def serve(req: Served, tunnel: Tunnel) -> None:
        req.start(200, None, CIMultiDict({"Content-Length": str(3 * 65536)}))
        for _ in range(3):
            await req.write(b"x" * 65536)
            written.append(len(c.t.out))
        await release.wait()  # the exchange does not read the body yet
        n = 0
        async for chunk in req.body():
            n += len(chunk)
        c.bodies.append(str(n).encode())
        await req.end()

    c.server.serve = serve
    c.server.pause_writing()  # the client reads slowly: its transport's buffer is full
    size = 2 * h1server.BODY_HIGH
    c.feed(f"POST /up HTTP/1.1\r\nHost: {D}\r\nContent-Length: {size}\r\n\r\n".encode())
    c.feed(b"y" * (h1server.BODY_HIGH + 1))
    await asyncio.sleep(0.01)
    assert 65536 < len(c.t.out) < 2 * 65536 and not written  # one chunk went out; its drain waits
    assert not c.t.reading  # the body's buffer is full: the client is not read meanwhile
    c.server.resume_writing()
    await asyncio.sleep(0.01)
    assert len(written) == 3
    release.set()
    await asyncio.sleep(0.01)
    assert c.t.reading  # drained: read again
    c.feed(b"y" * (size - h1server.BODY_HIGH - 1))
    await c.settle()
    assert c.bodies == [str(size).encode()] and answers(bytes(c.t.out))[0].complete


async def test_a_client_that_leaves_mid_body_cancels_its_exchange_and_gets_no_answer() -> None:
    c = Conn()
    seen: list[str] = []

    async def serve(req: Served, tunnel: Tunnel) -> None:
        try:
            async for _chunk in req.body():
                seen.append("chunk")
        except (ClientGone, asyncio.CancelledError) as e:
            seen.append(type(e).__name__)
            raise

    c.server.serve = serve
    c.feed(f"PUT /x HTTP/1.1\r\nHost: {D}\r\nContent-Length: 1000\r\n\r\n".encode() + b"z" * 10)
    await asyncio.sleep(0.01)
    c.server.connection_lost(ConnectionResetError())
    await c.settle()
    assert seen[0] == "chunk" and seen[-1] in ("CancelledError", "ClientGone")
    assert c.t.out == b"" and c.lost == 1


async def test_a_body_held_back_for_100_continue_closes_after_a_refusal() -> None:
    c = Conn()

    async def serve(req: Served, tunnel: Tunnel) -> None:
        await req.answer(own(503, "queue full"))  # before the permit: no 100 Continue, body unread

    c.server.serve = serve
    c.feed(f"PUT /x HTTP/1.1\r\nHost: {D}\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n".encode())
    await c.settle()
    assert b"100 Continue" not in c.t.out and answers(bytes(c.t.out))[0].status == 503
    assert c.t.closing and not c.t.aborted


async def test_an_unread_body_is_dropped_and_the_next_request_served() -> None:
    c = Conn()

    async def serve(req: Served, tunnel: Tunnel) -> None:
        c.served.append(req)
        await req.answer(own(421, "elsewhere"))

    c.server.serve = serve
    c.feed(f"POST /x HTTP/1.1\r\nHost: {D}\r\nContent-Length: 5\r\n\r\n".encode())
    await c.settle()
    c.feed(b"hello" + get("/next"))
    await c.settle()
    assert [r.target for r in c.served] == ["/x", "/next"] and len(answers(bytes(c.t.out))) == 2


async def test_a_close_delimited_answer_is_chunked_and_a_cut_is_an_abort() -> None:
    c = Conn()

    async def serve(req: Served, tunnel: Tunnel) -> None:
        req.start(200, "OK", CIMultiDict())
        await req.write(b"part")
        if req.target == "/cut":
            req.abort()
            return
        await req.end()

    c.server.serve = serve
    c.feed(get("/whole"))
    await c.settle()
    [a] = answers(bytes(c.t.out))
    assert a.headers["Transfer-Encoding"] == "chunked" and a.body == b"part" and a.complete
    c.feed(get("/cut"))
    await c.settle()
    assert c.t.aborted and not answers(bytes(c.t.out))[-1].complete


# -- properties over arbitrary client bytes -----------------------------------------------------------


def _well_formed(req: Served) -> bool:
    ok_method = req.method and all(ord(ch) in TOKEN for ch in req.method)
    ok_target = req.target and not any(ch in req.target for ch in " \r\n\x00\t")
    ok_names = all(k and all(ord(ch) in TOKEN for ch in k) for k in req.headers)
    ok_values = all(not any(ch in v for ch in "\r\n\x00") for v in req.headers.values())
    return bool(ok_method and ok_target and ok_names and ok_values)


def _run(data: bytes, cuts: list[int]) -> Conn:
    async def go() -> Conn:
        c = Conn(Limits(max_header_size=1024))
        start = 0
        for cut in sorted(cuts) + [len(data)]:
            c.feed(data[start:cut])
            start = max(start, cut)
            await asyncio.sleep(0)
        await c.settle()
        return c

    return asyncio.run(go())


FRAGMENTS = st.sampled_from([
    b"GET / HTTP/1.1\r\n", b"POST /p HTTP/1.1\r\n", b"Host: data.commoncrawl.org\r\n", b"\r\n",
    b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n", b"abc",
    b"X: \x00\r\n", b"Bad Header\r\n", b"HTTP/1.0", b" ", b"\n", b"Expect: 100-continue\r\n",
    b"GET http://x/ HTTP/1.1\r\n", b"Upgrade: h2c\r\nConnection: Upgrade\r\n", b"\xff\xfe",
])  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.binary(max_size=600), st.lists(FRAGMENTS, max_size=24).map(b"".join)),
    st.lists(st.integers(0, 600), max_size=6),
)
def test_arbitrary_bytes_never_raise_and_never_forward_a_malformed_head(data: bytes, cuts: list[int]) -> None:
    c = _run(data, cuts)
    assert all(t.done() and (t.cancelled() or t.exception() is None) for t in c.tasks)
    assert all(_well_formed(r) for r in c.served)
    assert len(answers(bytes(c.t.out))) >= len([b for b in c.bodies])  # every request served got its answer


REQUEST = st.builds(
    lambda path, body, close: (
        f"POST /{path} HTTP/1.1\r\nHost: {D}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        if body
        else f"GET /{path} HTTP/1.1\r\nHost: {D}\r\n\r\n".encode()
    ),
    st.text("abcxyz0123/", max_size=20),
    st.binary(max_size=40),
    st.booleans(),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(REQUEST, min_size=1, max_size=8), st.lists(st.integers(0, 800), max_size=8))
def test_every_complete_request_is_answered_once_in_order(reqs: list[bytes], cuts: list[int]) -> None:
    c = _run(b"".join(reqs), cuts)
    got = answers(bytes(c.t.out))
    assert len(c.served) == len(reqs) and len(got) == len(reqs)
    assert [a.body for a in got] == [f"politeproxy: {r.target}\n".encode() for r in c.served]
    assert [r.split(b" ", 2)[1].decode() for r in reqs] == [r.target for r in c.served]
    assert not c.t.closing
