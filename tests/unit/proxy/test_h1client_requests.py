"""The upstream client's requests besides a bodiless GET (issue 44 item 2): bodies streamed with their
Content-Length or chunked, never held whole; HEAD; methods that say ``Content-Length: 0``; an answer
that comes before the body's end; a body that breaks; and the pool's reuse for every method. Each against
a raw server on 127.0.0.1 that reads and writes the exact bytes (tests/support/rawupstream.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from yarl import URL

from politeproxy.proxy.origin.h1client import H1Client
from tests.support.rawupstream import (
    H,
    Peer,
    RawServer,
    answering,
    failure,
    headers,
    ok,
    past_quiet,
    read_all,
    to,
)

URL_ = URL(f"http://{H}/bucket/key")


async def pieces(*chunks: bytes, pulled: list[int] | None = None) -> AsyncIterator[bytes]:
    for c in chunks:
        if pulled is not None:
            pulled.append(len(c))
        yield c


async def test_a_body_with_its_length_and_one_without_arrive_whole(
    make_client: Callable[..., H1Client],
) -> None:
    """Content-Length: the bytes as they are; none: chunked (aiohttp's rule), each on the same pooled
    connection, which the next request reuses."""
    heads: list[bytes] = []

    async def handle(peer: Peer) -> None:
        while head := await peer.head():
            heads.append(head)
            if b"Content-Length: 11" in head:
                body = await peer.reader.readexactly(11)
            else:
                body = await peer.reader.readuntil(b"0\r\n\r\n")
            await peer.send(ok(body))

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.request("PUT", URL_, headers(Content_Length="11"), pieces(b"hello", b" world"))
        assert await read_all(a) == b"hello world"
        a.release()
        await past_quiet()
        a = await client.request("POST", URL_, headers(), pieces(b"abc", b"", b"de"))
        assert await read_all(a) == b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        a.release()
        assert srv.accepted == 1  # both on one connection
    assert heads[0].startswith(b"PUT /bucket/key HTTP/1.1\r\nHost: data.commoncrawl.org\r\n")
    assert b"Transfer-Encoding" not in heads[0]
    assert heads[1].endswith(b"Transfer-Encoding: chunked\r\n\r\n") and b"Content-Length" not in heads[1]


async def test_a_body_is_streamed_not_read_whole(make_client: Callable[..., H1Client]) -> None:
    """An upstream that reads nothing yet: the client stops pulling the body once the socket's buffers are
    full (drain), far short of the whole body."""
    pulled: list[int] = []
    release = asyncio.Event()
    chunk = b"x" * 65536
    total = 512  # 32 MiB offered

    async def handle(peer: Peer) -> None:
        await peer.head()
        await release.wait()
        while await peer.reader.read(1 << 20):
            pass

    async def body() -> AsyncIterator[bytes]:
        for _ in range(total):
            pulled.append(1)
            yield chunk

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=5.0)
        task = asyncio.ensure_future(
            client.request("PUT", URL_, headers(Content_Length=str(total * len(chunk))), body())
        )
        await asyncio.sleep(0.5)
        held = len(pulled)
        assert held < total // 4, f"{held} of {total} chunks pulled while the upstream read nothing"
        release.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_head_reads_no_body_and_the_connection_is_reused(make_client: Callable[..., H1Client]) -> None:
    """A HEAD's answer announces a length but carries no body; the next request goes on the same
    connection and reads its own answer, not the HEAD's announced bytes."""
    async with RawServer(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", ok(b"second"))) as srv:
        client = make_client(to(srv.port))
        a = await client.request("HEAD", URL_, headers(), None)
        assert (a.status, a.headers["Content-Length"]) == (200, "1000")
        assert await read_all(a) == b""
        a.release()
        await asyncio.sleep(0.01)  # the reuse guard's quiet time
        b = await client.get(URL_, headers())
        assert await read_all(b) == b"second"
        b.release()
        assert srv.accepted == 1
        assert srv.heads[0].startswith(b"HEAD /bucket/key HTTP/1.1\r\n")


async def test_a_head_answer_with_a_body_is_not_trusted(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", ok())) as srv:
        client = make_client(to(srv.port))
        a = await client.request("HEAD", URL_, headers(), None)
        await asyncio.sleep(0.05)  # the body arrives after the head, in a read of its own or with it
        with pytest.raises(Exception):  # noqa: B017 - UpstreamFailed: bytes nobody asked for
            await read_all(a)
        a.close()
        b = await client.get(URL_, headers())
        b.release()
        assert srv.accepted == 2  # never reused


@pytest.mark.parametrize(
    ("method", "says"), [("POST", True), ("PUT", True), ("DELETE", True), ("OPTIONS", False)]
)
async def test_a_method_that_may_carry_a_body_says_its_length_without_one(
    make_client: Callable[..., H1Client], method: str, says: bool
) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(to(srv.port))
        a = await client.request(method, URL_, headers(), None)
        a.close()
        assert srv.heads[0].startswith(method.encode() + b" /bucket/key HTTP/1.1\r\n")
        assert (b"Content-Length: 0\r\n" in srv.heads[0]) is says


async def test_an_answer_before_the_bodys_end_ends_the_connection(
    make_client: Callable[..., H1Client],
) -> None:
    """A 403 sent before the body was read: the client gets it; the connection, with the body's rest
    unsent, is never reused."""
    gate = asyncio.Event()

    async def handle(peer: Peer) -> None:
        if await peer.head():
            await peer.send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\ndenied")
            await peer.hang()

    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        await gate.wait()  # the rest never comes before the answer is read
        yield b"rest"

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.request("PUT", URL_, headers(Content_Length="9"), body())
        assert a.status == 403 and await read_all(a) == b"denied"
        a.release()
        await asyncio.sleep(0.01)  # the cancelled writer ends
        assert a.writer is not None and a.writer.cancelled()
        assert not client.idle_count


async def test_a_body_that_breaks_fails_the_request(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.hang()

    async def body() -> AsyncIterator[bytes]:
        yield b"some"
        raise ConnectionResetError("the client left")

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.request("PUT", URL_, headers(Content_Length="100"), body()))
        assert e.status == 502 and "the request body broke" in e.message
        await srv.wait_finished(1)  # the upstream saw the connection end, not a short body taken whole


async def test_a_body_shorter_than_its_length_is_never_sent_as_whole(
    make_client: Callable[..., H1Client],
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.request("PUT", URL_, headers(Content_Length="100"), pieces(b"short")))
        assert (e.status, e.local) == (400, "request")
        await srv.wait_finished(1)


async def test_a_post_is_never_sent_twice_on_a_stale_connection(make_client: Callable[..., H1Client]) -> None:
    """A reused connection that closes without answering: a GET goes again on a new one (RFC 9112 9.3.1
    allows it), a POST fails (the upstream may have acted on it)."""

    async def handle(peer: Peer) -> None:
        if peer.index == 1:
            await peer.head()
            await peer.send(ok())
            await peer.head()  # the second request on this connection: closed without an answer
            return
        while await peer.head():
            await peer.send(ok())

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL_, headers())
        await read_all(a)
        a.release()
        await asyncio.sleep(0.01)
        e = await failure(client.request("POST", URL_, headers(), None))
        assert e.status == 502 and e.gone
        assert srv.accepted == 1
