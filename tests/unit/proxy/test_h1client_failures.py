"""The lean upstream client: timeouts, refused and unresolvable upstreams, the DNS cache and verified TLS,
each against a raw server on 127.0.0.1 writing the bytes a test chooses (tests/support/rawupstream.py)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable

import pytest
import trustme
from aiohappyeyeballs import AddrInfoType
from yarl import URL

from politeproxy.proxy.origin import h1client
from politeproxy.proxy.origin.h1client import H1Client
from tests.support.rawupstream import (
    WHERE,
    H,
    Peer,
    RawServer,
    answering,
    closed_port,
    failure,
    headers,
    ok,
    past_quiet,
    read_all,
    read_until_failure,
    to,
    trusting,
)

# --- timeouts and connection failures ---------------------------------------------------------------------


async def test_an_upstream_that_never_answers_gives_504(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=0.3)
        started = time.monotonic()
        e = await failure(client.get(URL(f"http://{H}/"), headers()))
        waited = time.monotonic() - started
        assert (e.status, e.message) == (504, f"{WHERE} did not answer in time")
        assert 0.25 <= waited < 1.5
        await srv.wait_finished(1)  # the timed-out connection was closed, not pooled
        assert client.idle_count == 0


async def test_the_head_timeout_runs_between_reads(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await asyncio.sleep(0.3)
        await peer.send(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
        await asyncio.sleep(0.3)  # no gap of 0.5 s, but 0.6 s in all
        await peer.send(ok())
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=0.5)
        a = await client.get(URL(f"http://{H}/"), headers())  # today: UpstreamFailed 504 at 0.5 s
        assert a.status == 200
        a.close()


async def test_an_upstream_that_stops_mid_body_gives_504_on_read(
    make_client: Callable[..., H1Client],
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await peer.hang()

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), read_timeout=0.3)
        a = await client.get(URL(f"http://{H}/"), headers())
        got, e = await read_until_failure(a)
        assert got == b"0123456789"
        assert (e.status, e.message) == (504, f"{WHERE} sent nothing for 0.3s")
        a.close()
        await srv.wait_finished(1)


async def test_a_refused_connection_gives_502(make_client: Callable[..., H1Client]) -> None:
    client = make_client(to(closed_port()))
    e = await failure(client.get(URL(f"http://{H}/"), headers()))
    assert e.status == 502 and e.message.startswith(f"cannot connect to {WHERE}: ")


async def test_an_unresolvable_name_gives_502(make_client: Callable[..., H1Client]) -> None:
    name = "nohost.invalid"  # RFC 6761: never resolves
    try:
        async with asyncio.timeout(2):
            await asyncio.get_running_loop().getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except socket.gaierror:
        pass
    except TimeoutError:
        pytest.skip("the system resolver does not fail fast here")
    else:
        pytest.skip(f"the system resolver answers for {name}")
    client = make_client(lambda host, port: None, connect_timeout=1.0)
    e = await failure(client.get(URL(f"http://{name}/"), headers()))
    assert (e.status, e.message) == (502, f"cannot resolve {name}")
    assert (name, 80) not in client.dns  # a failure is not cached


async def test_a_tls_handshake_that_never_ends_gives_504(make_client: Callable[..., H1Client]) -> None:
    async def handle(peer: Peer) -> None:
        await peer.hang()  # accepts TCP, never answers the ClientHello

    async with RawServer(handle) as srv:
        client = make_client(to(srv.port), connect_timeout=0.3)
        started = time.monotonic()
        e = await failure(client.get(URL(f"https://{H}/"), headers()))
        assert (e.status, e.message) == (504, f"connecting to {H}:443 timed out")
        assert time.monotonic() - started < 1.5


# --- DNS --------------------------------------------------------------------------------------------------


def v4(port: int) -> AddrInfoType:
    """One getaddrinfo answer for 127.0.0.1:port, as the client caches them."""
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))


async def test_the_resolve_map_comes_first_and_system_answers_are_cached(
    make_client: Callable[..., H1Client],
) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(lambda host, port: ("127.0.0.1", srv.port) if host == H else None)
        a = await client.get(URL(f"http://{H}/"), headers())
        a.close()
        assert client.dns == {}  # the map answered: the system resolver was not asked

        a = await client.get(URL(f"http://localhost:{srv.port}/"), headers())  # /etc/hosts: offline
        a.close()
        _, addrs = client.dns[("localhost", srv.port)]
        assert ("127.0.0.1", srv.port) in [info[4][:2] for info in addrs]

        # a cached answer is used as it stands: a refused address gives way to the next (happy eyeballs)
        fresh = time.monotonic()
        client.dns[("cached.invalid", 80)] = (fresh, [v4(closed_port()), v4(srv.port)])
        a = await client.get(URL("http://cached.invalid/"), headers())
        assert await read_all(a) == b"hello"
        a.release()
        assert srv.accepted == 3


async def test_an_expired_dns_answer_is_asked_again(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(lambda host, port: None)
        stale = time.monotonic() - h1client.DNS_TTL - 1
        client.dns[("localhost", srv.port)] = (stale, [v4(closed_port())])
        a = await client.get(URL(f"http://localhost:{srv.port}/"), headers())  # not the stale, closed port
        a.close()
        assert client.dns[("localhost", srv.port)][0] > stale


async def test_the_dns_table_is_emptied_when_full(make_client: Callable[..., H1Client]) -> None:
    async with RawServer(answering(ok())) as srv:
        client = make_client(lambda host, port: None)
        now = time.monotonic()
        for i in range(h1client.DNS_ENTRIES):
            client.dns[(f"n{i}.invalid", 80)] = (now, [v4(1)])
        a = await client.get(URL(f"http://localhost:{srv.port}/"), headers())
        a.close()
        assert list(client.dns) == [("localhost", srv.port)]


# --- TLS --------------------------------------------------------------------------------------------------


async def test_a_verified_tls_get_works_and_its_connection_is_reused(
    make_client: Callable[..., H1Client], ca: trustme.CA, server_tls: ssl.SSLContext
) -> None:
    async with RawServer(answering(ok(b"over tls")), tls=server_tls) as srv:
        client = make_client(to(srv.port), tls=trusting(ca))
        for _ in range(2):
            a = await client.get(URL(f"https://{H}/crawl-data/x"), headers())
            assert a.status == 200 and await read_all(a) == b"over tls"
            a.release()
            await past_quiet()
        assert srv.accepted == 1
        assert srv.heads[0].startswith(b"GET /crawl-data/x HTTP/1.1\r\nHost: data.commoncrawl.org\r\n")


async def test_an_untrusted_certificate_gives_502(
    make_client: Callable[..., H1Client], server_tls: ssl.SSLContext
) -> None:
    async with RawServer(answering(ok()), tls=server_tls) as srv:
        client = make_client(to(srv.port), tls=trusting(trustme.CA()))  # another CA
        e = await failure(client.get(URL(f"https://{H}/"), headers()))
        assert e.status == 502 and e.message.startswith(f"TLS to {H}:443 failed: ")
        assert "local issuer" in e.message  # the verify message, not a class name
        assert not srv.heads  # no request went out


async def test_a_certificate_for_another_name_gives_502(
    make_client: Callable[..., H1Client], ca: trustme.CA, server_tls: ssl.SSLContext
) -> None:
    async with RawServer(answering(ok()), tls=server_tls) as srv:
        client = make_client(to(srv.port), tls=trusting(ca))
        e = await failure(client.get(URL("https://index.commoncrawl.org/"), headers()))
        assert e.status == 502 and e.message.startswith("TLS to index.commoncrawl.org:443 failed: ")


async def test_tls_close_delimited_body_with_close_notify_is_complete(
    make_client: Callable[..., H1Client], ca: trustme.CA, server_tls: ssl.SSLContext
) -> None:
    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\nto the end")
        # returning closes the TLS transport: close_notify, then FIN

    async with RawServer(handle, tls=server_tls) as srv:
        client = make_client(to(srv.port), tls=trusting(ca))
        a = await client.get(URL(f"https://{H}/"), headers())
        assert await read_all(a) == b"to the end"
        assert a.cut_reason is None
        a.release()


async def test_tls_close_delimited_body_without_close_notify_is_a_cut(
    make_client: Callable[..., H1Client], ca: trustme.CA, server_tls: ssl.SSLContext
) -> None:
    part_read = asyncio.Event()

    async def handle(peer: Peer) -> None:
        await peer.head()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\npart")
        await part_read.wait()
        peer.writer.transport.abort()  # a TCP close under the TLS session, no close_notify

    async with RawServer(handle, tls=server_tls) as srv:
        client = make_client(to(srv.port), tls=trusting(ca))
        a = await client.get(URL(f"https://{H}/"), headers())
        assert await a.content.read(100) == b"part"
        part_read.set()
        _, e = await read_until_failure(a)
        assert (
            e.status == 502
            and e.message == f"upstream {H}:443 cut the answer: TLS closed without close_notify"
        )
        a.close()


async def test_an_address_that_never_answers_gives_way_to_the_next_at_once(
    make_client: Callable[..., H1Client],
) -> None:
    """Happy eyeballs: a blackholed first address (here a listener whose full backlog drops every SYN,
    as a broken IPv6 route would) costs the 0.25 s attempt delay, not the connect timeout."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = [socket.socket() for _ in range(4)]
    for f in fillers:
        f.setblocking(False)
        f.connect_ex(full.getsockname())
    try:
        async with RawServer(answering(ok())) as srv:
            client = make_client(lambda host, port: None, connect_timeout=5.0)
            client.dns[("hang.invalid", 80)] = (time.monotonic(), [v4(full.getsockname()[1]), v4(srv.port)])
            started = time.monotonic()
            a = await client.get(URL("http://hang.invalid/"), headers())
            took = time.monotonic() - started
            assert await read_all(a) == b"hello"
            a.release()
            # the second address was tried after the attempt delay, long before the 5 s connect timeout
            assert 0.8 * h1client.HAPPY_EYEBALLS_DELAY <= took < 2.5, took
    finally:
        for s in [full, *fillers]:
            s.close()
