"""The lean upstream client: which connections go back to the pool and are reused, the request head on the
wire, flow control under a slow reader (raw servers on 127.0.0.1, tests/support/rawupstream.py)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

import pytest
from multidict import CIMultiDict
from yarl import URL

from politeproxy.proxy.origin import h1client
from politeproxy.proxy.origin.h1client import H1Client, _request_head
from tests.support.rawupstream import (
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
    to,
)

# --- pooling decisions ------------------------------------------------------------------------------------


async def test_connection_close_in_the_answer_is_not_pooled(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok(b"bye", b"Connection: close\r\n"))) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await read_all(a) == b"bye"
        a.release()
        assert client.idle_count == 0
        await srv.wait_finished(1)  # the server kept it open: the client closed it
        b = await client.get(URL(f"http://{H}/"), headers())
        b.close()
        assert srv.accepted == 2


async def test_an_http10_answer_is_not_pooled(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await read_all(a) == b"ok"
        a.release()
        assert client.idle_count == 0


async def test_an_answer_not_read_to_its_end_is_not_pooled(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok(b"x" * 1000))) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        assert await a.content.read(10) == b"x" * 10
        a.release()  # bytes left unread: this connection cannot carry the next answer
        assert client.idle_count == 0
        await srv.wait_finished(1)


async def test_bytes_past_the_content_length_are_dropped_with_the_connection(
    make_client: Callable[..., H1Client],
) -> None:
    async with RawServer(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhello")) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        e = await failure(read_all(a))  # more bytes than announced: not an answer (issue 25)
        assert "more bytes than its answer's length" in e.message
        a.release()
        assert client.idle_count == 0
        await srv.wait_finished(1)


async def test_an_idle_connection_the_upstream_closed_is_not_reused(
    make_client: Callable[..., H1Client],
) -> None:
    released = asyncio.Event()

    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(ok(b"one"))
        if peer.index == 1:
            await released.wait()
            return  # closes while the client holds the connection idle
        while await peer.head():
            await peer.send(ok(b"two"))

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/"), headers())
        await read_all(a)
        first = a.conn
        a.release()
        assert client.idle_count == 1
        released.set()
        async with asyncio.timeout(2):
            while first.usable():  # the FIN reaches the idle connection
                await asyncio.sleep(0.01)
        b = await client.get(URL(f"http://{H}/"), headers())
        assert b.conn is not first and not b.conn.reused
        assert await read_all(b) == b"one"
        b.release()
        assert srv.accepted == 2 and len(srv.heads) == 2  # nothing was written to the closed one


async def test_the_sweep_drops_closed_and_expired_idle_connections(
    make_client: Callable[..., H1Client],
) -> None:
    both_answered = asyncio.Event()

    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(ok())
        if peer.index == 1:
            await both_answered.wait()
            return  # the first connection closes while idle
        await peer.head()  # the second stays open until the client closes it

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        url = URL(f"http://{H}/")
        answers = await asyncio.gather(client.get(url, headers()), client.get(url, headers()))
        for a in answers:
            await read_all(a)
            a.release()
        assert client.idle_count == 2 and client.sweeper is not None
        conns = [a.conn for a in answers]
        both_answered.set()
        await srv.wait_finished(1)
        async with asyncio.timeout(2):
            while all(c.usable() for c in conns):  # the FIN reaches one of them
                await asyncio.sleep(0.01)
        client._sweep()
        assert client.idle_count == 1 and client.sweeper is not None  # the open one stays
        (survivor,) = client.idle[("http", H, 80)]
        assert survivor.usable() and [c for c in conns if c is not survivor][0].lost
        survivor.idle_since -= h1client.KEEPALIVE  # as if it had been idle that long
        client._sweep()
        assert client.idle_count == 0 and client.idle == {} and client.sweeper is None
        await srv.wait_finished(2)  # the expired one was closed by the client


async def test_a_reused_connection_closed_after_the_request_is_retried_once(
    make_client: Callable[..., H1Client],
) -> None:
    async def handle(peer: Peer) -> None:
        if peer.index == 1:
            await peer.head()
            await peer.send(ok(b"first"))
            await peer.head()  # reads the second request, then closes without a byte of answer
            return
        while await peer.head():
            await peer.send(ok(b"fresh"))

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/a"), headers())
        assert await read_all(a) == b"first"
        a.release()
        await past_quiet()
        b = await client.get(URL(f"http://{H}/b"), headers())
        assert await read_all(b) == b"fresh"
        assert not b.conn.reused
        b.release()
        assert srv.accepted == 2
        assert [h.split(b" ")[1] for h in srv.heads] == [b"/a", b"/b", b"/b"]


async def test_a_request_that_waits_out_the_quiet_time_grows_the_pool_by_one(
    make_client: Callable[..., H1Client],
) -> None:
    """Issue 44: clients that ask again as soon as they have an answer (a duckdb scan's reads). Each request
    waits out the quiet time on a connection that was there, as before, and the pool opens one more beside
    those waits: one for the key however many wait. The next request takes a quiet one at once, opening
    nothing."""
    async with RawServer(answering(ok(b"x"))) as srv:
        client = make_client(to(srv.port))
        first = await asyncio.gather(*(client.get(URL(f"http://{H}/a{i}"), headers()) for i in range(3)))
        conns = set()
        for a in first:
            assert await read_all(a) == b"x"
            conns.add(a.conn)
            a.release()
        assert srv.accepted == 3 and client.idle_count == 3
        got = await asyncio.gather(*(client.get(URL(f"http://{H}/b{i}"), headers()) for i in range(3)))
        assert [await read_all(g) for g in got] == [b"x"] * 3
        assert {g.conn for g in got} == conns  # each waited on one that was there, never for a connect
        for g in got:
            g.release()
        for _ in range(100):  # the opening beside the waits ends within a loopback connect
            if not client.growing:
                break
            await asyncio.sleep(0.01)
        assert not client.growing
        assert srv.accepted == 4  # three waits, one more connection
        c = await client.get(URL(f"http://{H}/c"), headers())
        assert await read_all(c) == b"x" and c.conn.reused  # a pooled one, quiet: taken without a wait
        c.release()
        assert srv.accepted == 4  # nothing more opened for it


async def test_close_stops_the_pool_growing(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok(b"x"))) as srv:
        client = make_client(to(srv.port))
        a = await client.get(URL(f"http://{H}/a"), headers())
        await read_all(a)
        a.release()
        key = a.conn.key
        client._grow(key)
        task = client.growing[key]
        client.close()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() or client.idle_count == 0
        assert client.idle == {} and not client.growing


async def test_a_fresh_connection_closed_without_an_answer_is_not_retried(
    make_client: Callable[..., H1Client],
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()  # then closes

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        assert (e.status, e.message, e.gone) == (502, f"upstream {WHERE} closed without answering", True)
        assert srv.accepted == 1


async def test_a_cancelled_get_leaves_no_connection_behind(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.head()  # returns when the client closes

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=5.0)
        task = asyncio.create_task(client.get(URL(f"http://{H}/"), headers()))
        async with asyncio.timeout(2):
            while not srv.heads:
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await srv.wait_finished(1)
        assert client.idle_count == 0


async def test_close_aborts_idle_connections_and_pools_nothing_after(
    make_client: Callable[..., H1Client],
) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(to(srv.port))
        url = URL(f"http://{H}/")
        a, b, c = await asyncio.gather(*(client.get(url, headers()) for _ in range(3)))
        for x in (a, b):
            await read_all(x)
            x.release()
        assert client.idle_count == 2
        client.close()
        assert client.idle_count == 0 and client.idle == {}
        await srv.wait_finished(2)
        await read_all(c)
        c.release()  # an answer in flight at close() ends with its connection
        assert client.idle_count == 0
        await srv.wait_finished(3)


async def test_the_idle_pool_never_exceeds_max_idle(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(to(srv.port), max_idle=2)
        answers = await asyncio.gather(*(client.get(URL(f"http://{H}/{i}"), headers()) for i in range(4)))
        other = await client.get(URL(f"http://{H}:8080/"), headers())  # another key counts in the same total
        assert srv.accepted == 5
        for a in [*answers, other]:
            await read_all(a)
            a.release()
            assert client.idle_count <= 2
        assert client.idle_count == 2 == sum(len(v) for v in client.idle.values())
        await srv.wait_finished(3)  # the three beyond the bound were closed


# --- the request head -------------------------------------------------------------------------------------


async def test_the_request_head_on_the_wire(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(to(srv.port))
        url = URL(f"http://{H}/crawl-data/a%20b/x.warc.gz?x=1&y=%2F&z", encoded=True)
        a = await client.get(url, headers(Range="bytes=0-9", X_Pipeline="p1"))
        a.close()
        assert srv.heads == [
            b"GET /crawl-data/a%20b/x.warc.gz?x=1&y=%2F&z HTTP/1.1\r\n"
            b"Host: data.commoncrawl.org\r\nRange: bytes=0-9\r\nX-Pipeline: p1\r\n\r\n"
        ]


@pytest.mark.parametrize(
    ("url", "host_line"),
    [
        ("http://data.commoncrawl.org/", "Host: data.commoncrawl.org"),
        ("http://data.commoncrawl.org:80/", "Host: data.commoncrawl.org"),
        ("https://data.commoncrawl.org:443/", "Host: data.commoncrawl.org"),
        ("http://data.commoncrawl.org:8080/", "Host: data.commoncrawl.org:8080"),
        ("http://data.commoncrawl.org:443/", "Host: data.commoncrawl.org:443"),
        ("https://data.commoncrawl.org:80/", "Host: data.commoncrawl.org:80"),
        ("http://[::1]:8080/", "Host: [::1]:8080"),
        ("http://127.0.0.1/", "Host: 127.0.0.1"),
    ],
)
def test_host_carries_the_port_only_when_not_the_default(url: str, host_line: str) -> None:
    u = URL(url)
    head, _ = _request_head("GET", u, u.raw_host or "", u.port or 0, CIMultiDict(), False)
    assert head == f"GET / HTTP/1.1\r\n{host_line}\r\n\r\n".encode()


@pytest.mark.parametrize("value", ["a\r\nInjected: 1", "a\nb", "a\rb", "trailing\r\n"])
async def test_a_header_value_with_a_line_break_is_refused_400(
    make_client: Callable[..., H1Client], value: str
) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(to(srv.port))
        e = await failure(client.get(URL(f"http://{H}/"), headers(X_Evil=value)))
        assert (e.status, e.message) == (400, "a header value holds a line break")
        assert srv.accepted == 0  # refused before any connection


# --- flow control -----------------------------------------------------------------------------------------


async def test_a_large_body_under_a_small_high_water_reaches_a_slow_reader_whole(
    make_client: Callable[..., H1Client],
) -> None:
    high = 64 * 1024
    body = random.Random(15).randbytes(4 * 1024 * 1024)

    async def handle(peer: Peer) -> None:
        while await peer.head():
            await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), high_water=high, read_timeout=2.0)
        a = await client.get(URL(f"http://{H}/big"), headers())
        digest, size, most, paused, reads = hashlib.sha256(), 0, 0, False, 0
        async with asyncio.timeout(20):
            while chunk := await a.content.read(16 * 1024):
                digest.update(chunk)
                size += len(chunk)
                most = max(most, a._buffered + len(chunk))
                paused = paused or a._paused
                reads += 1
                if reads % 8 == 0:
                    await asyncio.sleep(0.002)  # slower than the socket: the buffer fills, reading pauses
        assert (size, digest.hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())
        assert paused
        # the buffer passes the mark by at most one socket read (asyncio's reads are at most 256 KiB)
        assert most <= high + 256 * 1024
        a.release()
        assert client.idle_count == 1  # read to its end: the connection goes on
