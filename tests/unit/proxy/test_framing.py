"""The framing rules of client requests (proxy/door/framing.py, over llhttp), held against h11 as the
reference parser: generated requests, pipelined and cut into arbitrary reads, with the cases request
smuggling lives in (Content-Length beside Transfer-Encoding, repeated or odd lengths, codings, obs-fold, bare
LF, chunk extensions and trailers, missing or repeated Host, odd versions).

The property: every request the proxy's protocol reads and hands on, h11 reads too, the same one (method,
target, fields, body), in the same place in the stream; so no byte the proxy takes as one request's is
another request's to h11. Where the two differ, the proxy refuses what h11 would read (it is the stricter),
and ``test_stricter_than_the_reference`` names each such case. The one place it is the more lenient is
RFC 9112's own (2.2): empty lines before a request line are skipped, which h11 refuses
(``test_empty_lines_between_requests_are_skipped``); the reference here skips them too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from politeproxy.proxy.common.clientside import own
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.door.h1server import H1Server
from politeproxy.proxy.door.served import Served
from tests.support.fake_client import FakeTransport, answers

Parsed = tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]  # method, target, fields, body


@dataclass
class Limits:
    header: float = 15.0
    idle: float = 0.02  # a body that never comes whole ends the example soon (ClientGone)
    max_header_size: int = 64 * 1024


def ours(data: bytes, cuts: list[int]) -> tuple[list[Parsed], bytes]:
    """What the proxy's protocol hands on, in order, and what it wrote back."""
    got: list[Parsed] = []

    async def serve(req: Served, _tunnel: Tunnel) -> None:
        body = b"".join([c async for c in req.body()]) if req.has_body else b""
        fields = [(k.lower().encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
                  for k, v in req.headers.items()]  # fmt: skip
        # transfer-coding names are case-insensitive (RFC 9112 7): h11 lowercases them, the proxy keeps them
        fields = [(k, v.lower() if k == b"transfer-encoding" else v) for k, v in fields]
        got.append((req.method.encode(), req.target.encode("utf-8", "surrogateescape"), fields, body))
        await req.answer(own(200, "ok"))

    async def go() -> bytes:
        tasks: list[asyncio.Task[None]] = []

        def spawn(coro: object) -> asyncio.Task[None]:
            tasks.append(asyncio.get_running_loop().create_task(coro))  # type: ignore[arg-type]
            return tasks[-1]

        server = H1Server(Tunnel("10.0.0.9", "a", 443, "p"), serve, Limits(), lambda c, r: None, spawn,
                          lambda s: None)  # fmt: skip
        t = FakeTransport(server)
        server.connection_made(t)
        start = 0
        for cut in [*sorted(cuts), len(data)]:
            if not t.closing:
                server.data_received(data[start:cut])
            start = max(start, cut)
            for _ in range(5):
                await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.gather(*tasks, return_exceptions=True)
        server.connection_lost(None)
        return bytes(t.out)

    out = asyncio.run(go())
    return got, out


def reference(data: bytes) -> list[Parsed]:
    """What h11 reads of the same bytes, up to its first refusal (or a connection that must close)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    conn.receive_data(data)
    got: list[Parsed] = []
    body = bytearray()
    head: h11.Request | None = None
    try:
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA or ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
                return got
            if isinstance(ev, h11.Request):
                head, body = ev, bytearray()
            elif isinstance(ev, h11.Data):
                body += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                assert head is not None
                got.append((head.method, head.target, [(k, v) for k, v in head.headers], bytes(body)))
                conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                conn.send(h11.EndOfMessage())
                kept_10 = head.http_version == b"1.0" and _keep_alive(head)
                if conn.our_state is h11.MUST_CLOSE and not kept_10:
                    return got
                # h11 closes every HTTP/1.0 connection; the proxy keeps one that asks: h11 reads on from
                # the same byte, on a fresh connection. The one leniency the proxy keeps: empty lines
                # before a request line are skipped (RFC 9112 2.2: a server SHOULD ignore at least one;
                # old clients send a CRLF after a POST body), which h11 refuses; see
                # test_empty_lines_between_requests_are_skipped.
                rest = bytes(conn.trailing_data[0]).lstrip(b"\r\n")
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
                conn.receive_data(rest)
    except h11.RemoteProtocolError:
        return got


def _keep_alive(head: h11.Request) -> bool:
    return any(k == b"connection" and b"keep-alive" in v.lower() for k, v in head.headers)


# -- requests, with the constructs framing bugs live in --------------------------------------------------

EOL = st.sampled_from([b"\r\n"] * 6 + [b"\n"])  # now and then a bare LF
METHOD = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"get", b"FOO"])
TARGET = st.sampled_from([b"/", b"/a?b=c", b"http://a/x", b"*", b"/%20x", b"/a b"])
VERSION = st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2"])
FIELD = st.sampled_from([
    b"Host: a", b"Host: a", b"Host: b", b"Host:a ", b"Host : a",
    b"Content-Length: 3", b"Content-Length: 0", b"Content-Length: 5", b"Content-Length: +3",
    b"Content-Length: 3, 3", b"Content-Length:  3 ", b"Content-Length: 0x3",
    b"Transfer-Encoding: chunked", b"Transfer-Encoding: Chunked", b"Transfer-Encoding: gzip, chunked",
    b"Transfer-Encoding: chunked, gzip", b"Transfer-Encoding: identity", b"Transfer-Encoding:  chunked ",
    b"Connection: close", b"Connection: keep-alive", b"Expect: 100-continue",
    b"X-A: one two  ", b"X-A: \t", b"X-B: a\r\n b", b"X-B: a\r\n\tb", b" X-C: lead", b"X-D: a\x00b",
    b"X-E: caf\xc3\xa9",
])  # fmt: skip
CHUNK_SIZE = st.sampled_from([b"3", b"03", b"3;ext=1", b"3 ;x", b"3\t", b"+3", b"0x3"])
BODY = st.one_of(
    st.sampled_from([b"", b"abc", b"abcde", b"0\r\n\r\n"]),
    st.builds(
        lambda size, last, trailer, eol: size + eol + b"abc" + eol + last + eol + trailer + eol,
        CHUNK_SIZE,
        st.sampled_from([b"0", b"00", b"0;x=y", b"1"]),
        st.sampled_from([b"", b"T: 1\r\n", b"Content-Length: 9\r\n"]),
        EOL,
    ),
)


GOOD_BODY = st.sampled_from([
    b"Content-Length: 3\r\n\r\nabc", b"Content-Length: 0\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", b"\r\n",
])  # fmt: skip


@st.composite
def request(draw: st.DrawFn) -> bytes:
    """Mostly a well-formed request (so most examples are read by both), with up to three odd parts."""
    eol = draw(EOL) if draw(st.integers(0, 9)) == 0 else b"\r\n"
    method = draw(METHOD) if draw(st.integers(0, 4)) == 0 else draw(st.sampled_from([b"GET", b"POST"]))
    target = draw(TARGET) if draw(st.integers(0, 4)) == 0 else b"/x"
    version = draw(VERSION)
    fields = [] if draw(st.integers(0, 9)) == 0 else [b"Host: a"]
    fields += draw(st.lists(FIELD, max_size=draw(st.sampled_from([0, 0, 1, 2, 3]))))
    head = method + b" " + target + b" " + version + eol + b"".join(f + eol for f in fields)
    if draw(st.booleans()):
        return head + draw(GOOD_BODY)
    return head + eol + draw(BODY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request(), min_size=1, max_size=3).map(b"".join), st.lists(st.integers(0, 400), max_size=4))
def test_every_request_read_is_the_one_h11_reads_in_the_same_place(data: bytes, cuts: list[int]) -> None:
    got, out = ours(data, cuts)
    ref = reference(data)
    assert len(got) <= len(ref), (got, ref)
    for mine, theirs in zip(got, ref, strict=False):
        assert mine == theirs
    assert out.count(b" 200 OK\r\n") >= len(got)  # and each was answered (a HEAD's without a body)


CL, TE, HOST = b"Content-Length", b"Transfer-Encoding", b"Host: a\r\n"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        # Content-Length beside Transfer-Encoding: h11 reads the chunked body; refused (RFC 9112 6.1)
        (b"POST / HTTP/1.1\r\n" + HOST + CL + b": 3\r\n" + TE + b": chunked\r\n\r\n0\r\n\r\n", 400),
        # a repeated Content-Length, even an equal one: h11 takes it as one
        (b"POST / HTTP/1.1\r\n" + HOST + CL + b": 3\r\n" + CL + b": 3\r\n\r\nabc", 400),
        # obs-fold: h11 unfolds it
        (b"GET / HTTP/1.1\r\n" + HOST + b"X: a\r\n b\r\n\r\n", 400),
        # bare LF line ends: h11 reads them
        (b"GET / HTTP/1.1\nHost: a\n\n", 400),
        # a version other than 1.0 and 1.1: h11 reads HTTP/2.0 as a request line
        (b"GET / HTTP/2.0\r\n" + HOST + b"\r\n", 505),
        # Transfer-Encoding in HTTP/1.0: faulty framing (RFC 9112 6.1); h11 reads it chunked
        (b"POST / HTTP/1.0\r\n" + TE + b": chunked\r\n\r\n0\r\n\r\n", 400),
        # a method llhttp does not know (h11 takes any token)
        (b"FOO / HTTP/1.1\r\n" + HOST + b"\r\n", 400),
    ],
)
def test_stricter_than_the_reference(data: bytes, status: int) -> None:
    got, out = ours(data, [])
    assert not got and [a.status for a in answers(out)] == [status]
    assert reference(data), "h11 reads this one: the proxy is the stricter on purpose"


@pytest.mark.parametrize("between", [b"\r\n", b"\r\n\r\n", b"\n", b"\r"])
def test_empty_lines_between_requests_are_skipped(between: bytes) -> None:
    """RFC 9112 2.2: a server SHOULD ignore at least one empty line before a request line (old clients
    send a CRLF after a POST body); llhttp skips any CR or LF there, h11 refuses. Harmless here: the proxy
    writes its own request upstream, so no second parser ever reads these bytes."""
    one = b"POST /x HTTP/1.1\r\n" + HOST + CL + b": 3\r\n\r\nabc"
    two = b"GET /y HTTP/1.1\r\n" + HOST + b"\r\n"
    got, out = ours(one + between + two, [])
    assert [(m, t) for m, t, _, _ in got] == [(b"POST", b"/x"), (b"GET", b"/y")]
    assert [a.status for a in answers(out)] == [200, 200]
    strict = h11.Connection(h11.SERVER)
    strict.receive_data(one + between + two)
    with pytest.raises(h11.RemoteProtocolError):  # h11: the POST, then "no request line received"
        while strict.next_event() is not h11.NEED_DATA:
            if strict.their_state is h11.DONE:
                strict.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                strict.send(h11.EndOfMessage())
                strict.start_next_cycle()


def test_a_coding_before_chunked_is_501_as_in_h11() -> None:
    """The proxy decodes no coding but chunked: llhttp reads gzip-then-chunked, framing.py refuses it."""
    data = b"POST / HTTP/1.1\r\n" + HOST + TE + b": gzip, chunked\r\n\r\n0\r\n\r\n"
    got, out = ours(data, [])
    assert not got and [a.status for a in answers(out)] == [501] and not reference(data)


def test_trailers_are_dropped_and_a_chunk_extension_ignored() -> None:
    data = b"POST / HTTP/1.1\r\n" + HOST + TE + b": chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
    got, _ = ours(data, [])
    [(method, _target, fields, body)] = got
    assert (method, body) == (b"POST", b"abc") and b"x-t" not in dict(fields)
    assert got == reference(data) or reference(data)[0][3] == b"abc"


def test_a_field_values_trailing_whitespace_is_trimmed_as_h11_does() -> None:
    data = b"GET / HTTP/1.1\r\nHost: a \t\r\nX-A:  one two  \r\n\r\n"
    got, _ = ours(data, [])
    assert got == reference(data)
    assert dict(got[0][2])[b"x-a"] == b"one two"
