"""The lean upstream client (``proxy/origin/h1client.py``, ``proxy/origin/h1conn.py``): bodies, interim
answers and the bounds on an answer head, each answered by a raw server on 127.0.0.1
(tests/support/rawupstream.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from multidict import CIMultiDictProxy
from yarl import URL

from politeproxy.proxy.origin.h1client import H1Client
from politeproxy.proxy.origin.h1conn import MAX_FIELDS, MAX_HEAD
from tests.support.rawupstream import (
    OVER_HEAD,
    WHERE,
    H,
    Peer,
    RawServer,
    answering,
    failure,
    headers,
    ok,
    past_quiet,
    read_all,
    read_until_failure,
    to,
)

# --- bodies and the pool ----------------------------------------------------------------------------------


async def test_content_length_body_is_read_and_the_connection_reused(
    make_client: Callable[..., H1Client],
) -> None:
    async with RawServer(answering(ok(b"first"), ok(b"second body"))) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/one"), headers())
        assert (a.status, a.reason, a.headers["Content-Length"]) == (200, "OK", "5")
        assert isinstance(a.headers, CIMultiDictProxy)
        assert await read_all(a) == b"first"
        assert a.content.at_eof()
        first_conn = a.conn
        a.release()
        assert a.closed and client.idle_count == 1

        await past_quiet()
        b = await client.get(URL(f"http://{H}/two"), headers())
        assert b.conn is first_conn and b.conn.reused
        assert await read_all(b) == b"second body"
        b.release()
        assert srv.accepted == 1 and len(srv.heads) == 2
        assert client.idle_count == 1


async def test_chunked_body_split_across_writes(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        while await peer.head():
            await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
            await asyncio.sleep(0.01)  # the chunk's end arrives in a later read
            await peer.send(b"lo\r\n6\r\n world\r\n0\r\n\r\n")

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await read_all(a, 4) == b"hello world"
        a.release()
        assert client.idle_count == 1  # a chunked answer ends by its framing: the connection goes on


async def test_close_delimited_body_ended_by_a_clean_close_is_complete(
    make_client: Callable[..., H1Client],
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        # returning closes the connection: a FIN after the body

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await read_all(a) == b"all of it"
        assert a.content.at_eof() and a.cut_reason is None
        a.release()
        assert client.idle_count == 0  # ended by the close: nothing to pool


async def test_close_delimited_body_ended_by_a_reset_is_a_cut(make_client: Callable[..., H1Client]) -> None:
    part_read = asyncio.Event()

    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\npart")
        await part_read.wait()
        peer.reset()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await a.content.read(100) == b"part"
        part_read.set()
        _, e = await read_until_failure(a)
        assert e.status == 502
        assert e.message == f"upstream {WHERE} cut the answer: connection reset"
        assert a.cut_reason == "connection reset" and not a.content.at_eof()
        a.close()


async def test_content_length_body_cut_short_fails_the_read(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40)

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        got, e = await read_until_failure(a)
        assert got == b"x" * 40
        assert (e.status, e.message) == (
            502,
            f"upstream {WHERE} cut the answer: connection closed before the answer's end",
        )
        a.close()


async def test_interim_answers_before_the_answer_are_skipped(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        await peer.send(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")
        await peer.send(ok(b"done", b"X-Final: yes\r\n"))
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert (a.status, a.reason) == (200, "OK")
        assert list(a.headers.items()) == [("Content-Length", "4"), ("X-Final", "yes")]
        assert await read_all(a) == b"done"
        a.release()


async def test_switching_protocols_fails_502(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        )
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        assert e.status == 502
        assert e.message == (
            f"upstream {WHERE} sent a malformed answer: switched protocols, which this proxy never asked for"
        )
        assert client.idle_count == 0


async def test_a_head_over_max_head_bytes_fails_502_at_the_bound(
    make_client: Callable[..., H1Client],
) -> None:
    """An upstream that sends header lines without end: the client stops at MAX_HEAD and hangs up, well
    before its read timeout, instead of buffering what keeps coming."""

    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\n")
        while True:  # ends when the client aborts the connection (a ConnectionError)
            await peer.send(b"X-Filler: " + b"a" * 1000 + b"\r\n")

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=5.0)
        started = time.monotonic()
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        assert time.monotonic() - started < 2.0  # the bound, not the read timeout
        assert (e.status, e.message) == (502, f"upstream {WHERE} sent a malformed answer: {OVER_HEAD}")
        await srv.wait_finished(1)  # the client hung up: the server's writes failed


async def test_a_head_over_max_fields_fails_502(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(
            b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * (MAX_FIELDS + 1) + b"Content-Length: 0\r\n\r\n"
        )
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        assert e.status == 502 and e.message.endswith(OVER_HEAD)


async def test_a_head_of_exactly_max_fields_lines_is_accepted(make_client: Callable[..., H1Client]) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_FIELDS - 1))
    async with RawServer(answering(b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 2\r\n\r\nok")) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert len(a.headers) == MAX_FIELDS and await read_all(a) == b"ok"
        a.release()


@pytest.mark.parametrize("start", [b"HTTP/1.1 200 OK\r\nX-Long: ", b"HTTP/1.1 200 "], ids=["field", "reason"])
async def test_one_endless_head_line_is_bounded_too(
    make_client: Callable[..., H1Client], start: bytes
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(start + b"a" * (4 * MAX_HEAD))
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=0.3)
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        assert e.status == 502  # today: 504 after the read timeout, with 256 KiB of one line held
