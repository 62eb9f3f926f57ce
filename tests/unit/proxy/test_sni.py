"""The server name in a tunnel's first bytes (proxy/door/sni.py): a parser of untrusted client bytes."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.policy.hosts import valid_hostname
from politeproxy.proxy.door.peek import _Peek
from politeproxy.proxy.door.sni import MAX_HELLO, MORE, NONE, Peeked, server_name

CLIENT = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no trust store: only its first flight is used
NO_SNI = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
NO_SNI.check_hostname = False


def hello(name: str | None) -> bytes:
    """A real ClientHello from CPython's ssl, as a client would send it first."""
    ctx = CLIENT if name is not None else NO_SNI
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


DATA = hello("data.commoncrawl.org")


def test_a_hello_names_its_server() -> None:
    assert server_name(DATA) == Peeked(True, "data.commoncrawl.org")
    assert server_name(hello("Index.CommonCrawl.org")) == Peeked(True, "index.commoncrawl.org")


def test_no_sni_not_tls_and_too_much_name_nothing() -> None:
    assert server_name(hello(None)) == NONE
    assert server_name(b"GET / HTTP/1.1\r\n\r\n") == NONE
    assert server_name(b"SSH-2.0-OpenSSH_9.6\r\n") == NONE
    assert server_name(b"\x16" + b"\x03" * MAX_HELLO) == NONE  # over the byte bound: stop peeking


def test_a_partial_hello_asks_for_more() -> None:
    assert server_name(b"") == MORE
    for cut in (1, 5, 6, len(DATA) // 2, len(DATA) - 1):
        assert server_name(DATA[:cut]) == MORE, cut


@pytest.mark.parametrize("bad", [b"\xffaaa", b"A/..", b"a_bb", b"\x7fxyz"])
def test_a_server_name_that_is_no_host_name_is_none(bad: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    """Not ASCII, a path, an underscore, a control character: no name, and nothing on stderr (CPython
    reports a non-ASCII name as an "Exception ignored" unless the peek quiets it)."""
    mutated = hello("aaaa.commoncrawl.org").replace(b"aaaa", bad)
    assert server_name(mutated) == NONE
    assert "Exception ignored" not in capfd.readouterr().err


label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
names = st.lists(label, min_size=1, max_size=4).map(lambda ls: ".".join([*ls, "example"]))


@settings(max_examples=200, deadline=None)
@given(name=names, cut=st.integers(min_value=0, max_value=2000))
def test_real_hellos_round_trip(name: str, cut: int) -> None:
    """A ClientHello for any valid host name gives that name back; any strict prefix of it asks for more."""
    data = hello(name)
    assert server_name(data) == Peeked(True, name)
    assert server_name(data[: min(cut, len(data) - 1)]) == MORE


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=600))
@example(data=b"\x16\x03\x01\x00\x00")
@example(data=b"\x16\x03\x01\xff\xff" + b"\x01" * 100)
def test_any_bytes_never_raise(data: bytes) -> None:
    """Any client bytes: a Peeked, never an exception; "more" only for an empty start or one that could
    still be a TLS handshake record; a name only when it is a valid host name."""
    got = server_name(data)
    assert isinstance(got, Peeked)
    if not got.done:
        assert not data or data[0] == 0x16
    assert got.name is None or valid_hostname(got.name)


@settings(max_examples=400, deadline=None)
@given(pos=st.lists(st.integers(min_value=0, max_value=len(DATA) - 1), max_size=4), byte=st.integers(0, 255))
def test_mutated_hellos_never_raise(pos: list[int], byte: int) -> None:
    """A real hello with a few bytes changed (lengths, extension types, the name): never raises; any name
    it yields is a valid host name."""
    data = bytearray(DATA)
    for p in pos:
        data[p] = byte
    got = server_name(bytes(data))
    assert got.name is None or valid_hostname(got.name)


class _Transport:
    """What _Peek uses of a transport: pausing."""

    paused = False

    def pause_reading(self) -> None:
        self.paused = True


def _peek(first: bytes, chunks: list[bytes]) -> tuple[_Peek, _Transport]:
    async def run() -> tuple[_Peek, _Transport]:
        peek, t = _Peek(first), _Transport()
        peek.connection_made(t)  # type: ignore[arg-type]
        for c in chunks:
            peek.data_received(c)
        return peek, t

    return asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(first=st.binary(max_size=40), chunks=st.lists(st.binary(max_size=300), max_size=5))
def test_the_peek_keeps_every_byte(first: bytes, chunks: list[bytes]) -> None:
    """Any bytes with the CONNECT and after it, in any chunks: the peek keeps all of them in order (the
    relay or the TLS gets them), never raises, and pauses the client once it has decided."""
    peek, t = _peek(first, chunks)
    assert bytes(peek.buf) == first + b"".join(chunks)
    assert peek.done.done() == peek.result.done
    if peek.done.done():
        assert t.paused


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(DATA) - 1), min_size=1, max_size=4, unique=True))
def test_a_hello_in_any_chunks_is_read_once_whole(cuts: list[int]) -> None:
    """A real ClientHello split anywhere (the first piece sent with the CONNECT): the peek waits until the
    last piece, then names the server, with every byte kept."""
    edges = [0, *sorted(cuts), len(DATA)]
    pieces = [DATA[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    partial, _ = _peek(pieces[0], pieces[1:-1])
    assert not partial.done.done()
    peek, t = _peek(pieces[0], pieces[1:])
    assert peek.result == Peeked(True, "data.commoncrawl.org") and t.paused
    assert bytes(peek.buf) == DATA


def test_an_old_tls_hello_still_names_its_server() -> None:
    """A TLS 1.0 ClientHello (legacy version 3.1) naming a paced host: the peek reads its name anyway,
    so the client is intercepted (and refused by the proxy's TLS 1.2 floor), not tunnelled blind."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="data.commoncrawl.org")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    data = outgoing.read()
    old = data[:9] + b"\x03\x01" + data[11:]  # record header (5), handshake header (4), client_version
    assert server_name(old) == Peeked(True, "data.commoncrawl.org")
