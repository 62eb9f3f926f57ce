"""Properties of the lean upstream client's parser of untrusted upstream bytes
(``proxy/origin/h1conn.py``): any bytes, and valid answers split anywhere, fed straight into the connection
protocol without a socket."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDictProxy
from yarl import URL

from politeproxy.proxy.origin.h1conn import H1Answer, H1Conn, UpstreamFailed
from tests.support.rawupstream import (
    now,
)

# --- properties of the parser of untrusted upstream bytes -------------------------------------------------


def fed(chunks: list[bytes]) -> tuple[H1Conn, H1Answer]:
    """A connection without a transport (abort only marks it lost) fed ``chunks``, then a FIN."""
    conn = H1Conn(("http", "h", 80), "h:80", tls=False)
    answer = H1Answer(conn, URL("http://h/"), 1.0, 64 * 1024)
    conn.answer = answer
    for chunk in chunks:
        if conn.lost:
            break  # an aborted transport delivers nothing more
        conn.data_received(chunk)
    if not conn.lost:
        conn.eof_received()
    return conn, answer


TOKENS = st.sampled_from(
    [
        b"HTTP/1.1 ",
        b"HTTP/1.0 ",
        b"200 OK\r\n",
        b"204 No Content\r\n",
        b"100 Continue\r\n",
        b"103 Early Hints\r\n",
        b"101 Switching\r\n",
        b"Content-Length: 5\r\n",
        b"Content-Length: -1\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: close\r\n",
        b"X: \xff\x00\r\n",
        b"\r\n",
        b"5\r\nhello\r\n",
        b"ffffffffffffffffff\r\n",
        b"0\r\n\r\n",
        b"hello",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(TOKENS, st.binary(max_size=40)), max_size=24))
@example([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"junk"])
@example([b"HTTP/1.1 101 Switching\r\n\r\n"])
@example([b"\x00" * 10])
@example([b"HTTP/1.1 200 OK\r\n\r\nclose-delimited"])
def test_any_upstream_bytes_end_in_an_answer_or_a_502(chunks: list[bytes]) -> None:
    """Whatever bytes arrive, in whatever pieces, then a close: nothing raises, and the answer either is
    complete with a status of at least 200 and its headers, or failed with an UpstreamFailed 502. Its
    reader never waits, and gets the answer's body or the failure."""
    conn, a = fed(chunks)
    if a.complete:
        assert a.status >= 200 and isinstance(a.headers, CIMultiDictProxy)
        now(a.head())
        while now(a.content.read(1 << 16)):
            pass
        assert a.content.at_eof()
    else:
        err = a._error
        assert isinstance(err, UpstreamFailed) and err.status == 502
        with pytest.raises(UpstreamFailed):
            now(a.head())
            while now(a.content.read(1 << 16)):
                pass


def splits(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """``data`` cut at arbitrary points."""
    cuts = st.lists(st.integers(0, len(data)), max_size=12).map(sorted)
    return cuts.map(lambda cs: [data[i:j] for i, j in zip([0, *cs], [*cs, len(data)], strict=True) if i < j])


@st.composite
def framed_answers(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    body = draw(st.binary(max_size=3000))
    interim = draw(
        st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 EH\r\nLink: <x>\r\n\r\n"])
    )
    if draw(st.booleans()):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        wire = head + body
    else:
        sizes = draw(st.lists(st.integers(1, 700), max_size=8))
        pieces, rest = [], body
        for n in sizes:
            pieces.append(rest[:n])
            rest = rest[n:]
        pieces.append(rest)
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"
    return body, draw(splits(interim + wire))


@settings(max_examples=300, deadline=None)
@given(framed_answers())
def test_a_framed_answer_split_anywhere_yields_exactly_its_body(case: tuple[bytes, list[bytes]]) -> None:
    """A valid Content-Length or chunked answer, after any interim answer, cut into arbitrary pieces: the
    reader gets exactly its body, and the connection may be reused."""
    body, chunks = case
    conn = H1Conn(("http", "h", 80), "h:80", tls=False)
    a = H1Answer(conn, URL("http://h/"), 1.0, 64 * 1024)
    conn.answer = a
    for chunk in chunks:
        conn.data_received(chunk)
    assert a.complete and a.keep_alive and a._error is None and not conn.lost
    assert a.status == 200
    got = b""
    while piece := now(a.content.read(1000)):
        got += piece
    assert got == body


def test_a_second_answer_in_the_same_read_does_not_replace_the_first() -> None:
    conn = H1Conn(("http", "h", 80), "h:80", tls=False)
    a = H1Answer(conn, URL("http://h/"), 1.0, 64 * 1024)
    conn.answer = a
    conn.data_received(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
        b"HTTP/1.1 404 Nope\r\nX-Evil: 1\r\nContent-Length: 3\r\n\r\nabc"
    )
    assert (a.status, a.reason, a.headers.get("X-Evil")) == (200, "OK", None)
    with pytest.raises(UpstreamFailed, match="more bytes than its answer's length"):
        now(a.content.read(100))  # the first answer ran long: not served, not even its first bytes
    assert conn.lost  # bytes nobody asked for: the connection is not trusted again
