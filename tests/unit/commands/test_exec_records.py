"""exec_records.py: the readers of what a program in `politeproxy exec`'s namespace sends (a DNS query, a
frame on the loopback) never raise, whatever the bytes; the tally stays bounded; the report reads back."""

from __future__ import annotations

import ipaddress
import struct

import dns.flags
import dns.message
import dns.rcode
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.commands.exec_records import (
    MAX_KEYS,
    Attempt,
    KeyCounts,
    attempt,
    refuse,
    report_lines,
)

ETH = b"\x00" * 12


def _ipv4(proto: int, dst: str, transport: bytes, frag: int = 0) -> bytes:
    src, to = ipaddress.IPv4Address("127.0.0.1").packed, ipaddress.IPv4Address(dst).packed
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(transport), 1, frag, 64, proto, 0, src, to)
    return ETH + b"\x08\x00" + head + transport


def _ipv6(proto: int, dst: str, transport: bytes) -> bytes:
    head = struct.pack("!IHBB16s16s", 6 << 28, len(transport), proto, 64,
                       ipaddress.IPv6Address("::1").packed, ipaddress.IPv6Address(dst).packed)  # fmt: skip
    return ETH + b"\x86\xdd" + head + transport


def _tcp(sport: int, dport: int, flags: int) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, flags, 65535, 0, 0)


def test_a_syn_is_an_attempt_to_its_destination() -> None:
    got = attempt(_ipv4(6, "192.0.2.1", _tcp(40000, 443, 0x02)))
    assert got == Attempt("192.0.2.1", 443, "tcp", 40000)
    assert got.key == "192.0.2.1:443/tcp"
    v6 = attempt(_ipv6(6, "2001:db8::1", _tcp(40000, 8443, 0x02)))
    assert v6 is not None and v6.key == "[2001:db8::1]:8443/tcp"


def test_other_tcp_segments_and_later_fragments_are_not() -> None:
    assert attempt(_ipv4(6, "192.0.2.1", _tcp(443, 40000, 0x12))) is None  # SYN-ACK
    assert attempt(_ipv4(6, "192.0.2.1", _tcp(40000, 443, 0x10))) is None  # ACK
    assert attempt(_ipv4(6, "192.0.2.1", _tcp(40000, 443, 0x02), frag=5)) is None
    assert attempt(_ipv4(1, "192.0.2.1", b"\x08\x00" + b"\x00" * 6)) is None  # ICMP


def test_every_datagram_is_an_attempt() -> None:
    got = attempt(_ipv4(17, "198.51.100.7", struct.pack("!HHHH", 5000, 443, 8, 0)))
    assert got == Attempt("198.51.100.7", 443, "udp", 5000)


@given(st.binary(max_size=200))
def test_attempt_never_raises(frame: bytes) -> None:
    got = attempt(frame)
    assert got is None or (got.kind in ("tcp", "udp") and 0 <= got.port < 65536)


@given(
    st.binary(max_size=80), st.sampled_from([b"\x08\x00", b"\x86\xdd"]), st.sampled_from([0x45, 0x60, 0x4F])
)
def test_attempt_never_raises_on_cut_headers(rest: bytes, ethertype: bytes, first: int) -> None:
    attempt(ETH + ethertype + bytes([first]) + rest)


def test_a_query_is_refused_and_its_name_noted() -> None:
    q = dns.message.make_query("commoncrawl.s3.amazonaws.com", "AAAA")
    name, answer = refuse(q.to_wire())
    assert name == "commoncrawl.s3.amazonaws.com"
    assert answer is not None
    reply = dns.message.from_wire(answer)
    assert reply.id == q.id and reply.rcode() == dns.rcode.REFUSED and reply.flags & dns.flags.QR


def test_an_answer_or_garbage_gets_nothing() -> None:
    q = dns.message.make_query("example.org", "A")
    assert refuse(dns.message.make_response(q).to_wire()) == (None, None)
    assert refuse(b"\x00\x01") == (None, None)


@given(st.binary(max_size=600))
def test_refuse_never_raises(wire: bytes) -> None:
    name, answer = refuse(wire)
    assert name is None or len(name) <= 253
    assert answer is None or len(answer) <= 512


def test_the_tally_is_bounded() -> None:
    t = KeyCounts()
    for i in range(MAX_KEYS + 50):
        t.add(f"n{i}.example")
    t.add("n0.example")
    assert len(t.counts) == MAX_KEYS and t.dropped == 50 and t.counts["n0.example"] == 2


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
)


@given(JSONISH)
def test_a_report_reads_back_defensively(doc: object) -> None:
    t = KeyCounts.from_json(doc)
    assert all(isinstance(v, int) and v > 0 for v in t.counts.values()) and t.dropped >= 0


def test_the_report_names_what_went_around() -> None:
    names, addresses = KeyCounts(), KeyCounts()
    assert report_lines(names, addresses, 3) == [
        "politeproxy exec: nothing went around the proxy (3 connection(s) to it)"
    ]
    names.add("data.commoncrawl.org")
    names.add("data.commoncrawl.org")
    addresses.add("192.0.2.1:443/tcp")
    addresses.add("bad\x1b[31m")
    text = "\n".join(report_lines(names, addresses, 0))
    assert "data.commoncrawl.org  x2" in text and "192.0.2.1:443/tcp  x1" in text
    assert "\x1b" not in text and "bad\\x1b[31m" in text
