"""What `politeproxy exec` saw go around the proxy: the names asked of its stub resolver, the addresses a
connection was tried to, read from raw bytes (untrusted: whatever a program in the namespace sends), kept
in a bounded tally, and the report printed when the command ends.

Every reader here takes bytes and returns a value or None: it never raises on what a program sent.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.rcode

MAX_KEYS = 200  # distinct names (or addresses) kept with their counts; the rest are only counted
MAX_NAME = 253  # a DNS name's longest text form

ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
TCP, UDP = 6, 17
SYN, ACK = 0x02, 0x10


@dataclass
class KeyCounts:
    """Counts per key, at most MAX_KEYS keys: a program looping over random names cannot grow it."""

    counts: dict[str, int] = field(default_factory=dict)
    dropped: int = 0  # events whose key was not kept

    def add(self, key: str) -> None:
        if key in self.counts:
            self.counts[key] += 1
        elif len(self.counts) < MAX_KEYS:
            self.counts[key] = 1
        else:
            self.dropped += 1

    def to_json(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "dropped": self.dropped}

    @classmethod
    def from_json(cls, doc: Any) -> KeyCounts:
        """Read back defensively: a report file that is not what this module wrote gives an empty tally."""
        t = cls()
        if not isinstance(doc, dict):
            return t
        counts = doc.get("counts")
        if isinstance(counts, dict):
            for k, v in list(counts.items())[:MAX_KEYS]:
                if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    t.counts[k[:300]] = v
        dropped = doc.get("dropped")
        t.dropped = (
            dropped if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped > 0 else 0
        )
        return t


# --- the stub resolver's side -----------------------------------------------------------------------


def refuse(wire: bytes) -> tuple[str | None, bytes | None]:
    """A DNS query's first question name, and the REFUSED answer to send back (None: not a query; drop it).

    dnspython reads the message, so a truncated or hostile packet is a DNSException, never a crash."""
    try:
        query = dns.message.from_wire(wire, ignore_trailing=True)
    except (dns.exception.DNSException, ValueError, IndexError, UnicodeError):
        return None, None
    if query.flags & dns.flags.QR:  # an answer, not a question: nothing to say
        return None, None
    name = None
    if query.question:
        name = query.question[0].name.to_text(omit_final_dot=True)[:MAX_NAME] or "."
    answer = dns.message.make_response(query)
    answer.set_rcode(dns.rcode.REFUSED)
    try:
        return name, answer.to_wire(max_size=512)
    except dns.exception.DNSException:  # too big to repeat the question: the name is still recorded
        return name, None


# --- the loopback's side: a connection tried to an address ------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """A connection opened (TCP SYN) or a datagram sent, to ``host`` (an address) and ``port``."""

    host: str
    port: int
    kind: str  # tcp or udp
    source_port: int

    @property
    def key(self) -> str:
        """``ADDR:PORT/tcp``, the report's line."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}/{self.kind}"


def attempt(frame: bytes) -> Attempt | None:
    """The Attempt in a frame that opens a connection or sends a datagram, else None.

    ``frame`` is what an AF_PACKET socket on the namespace's loopback reads: a 14-byte Ethernet header
    (zeros on lo), then IPv4 or IPv6. A TCP SYN without ACK is an attempt to connect; every UDP datagram is
    one (the stub resolver's port is filtered by the caller)."""
    if len(frame) < 14:
        return None
    (ethertype,) = struct.unpack_from("!H", frame, 12)
    packet = frame[14:]
    if ethertype == ETH_P_IP:
        got = _ipv4(packet)
    elif ethertype == ETH_P_IPV6:
        got = _ipv6(packet)
    else:
        return None
    if got is None:
        return None
    proto, dst, rest = got
    if len(rest) < 4:
        return None
    source, port = struct.unpack_from("!HH", rest, 0)
    if proto == TCP:
        if len(rest) < 14 or (rest[13] & (SYN | ACK)) != SYN:
            return None
        kind = "tcp"
    elif proto == UDP:
        kind = "udp"
    else:
        return None
    return Attempt(dst, port, kind, source)


def _ipv4(p: bytes) -> tuple[int, str, bytes] | None:
    if len(p) < 20 or p[0] >> 4 != 4:
        return None
    ihl = (p[0] & 0x0F) * 4
    (frag,) = struct.unpack_from("!H", p, 6)
    if ihl < 20 or len(p) < ihl or frag & 0x1FFF:  # a later fragment has no transport header
        return None
    return p[9], str(ipaddress.IPv4Address(p[16:20])), p[ihl:]


def _ipv6(p: bytes) -> tuple[int, str, bytes] | None:
    # Extension headers are not followed: a plain SYN or datagram has none, and a skipped one is only
    # a line missing from the report, never a connection let through (nothing leaves the namespace).
    if len(p) < 40 or p[0] >> 4 != 6:
        return None
    return p[6], str(ipaddress.IPv6Address(p[24:40])), p[40:]


# --- the report -------------------------------------------------------------------------------------


def report_lines(names: KeyCounts, addresses: KeyCounts, relayed: int) -> list[str]:
    """What `exec` prints on stderr when COMMAND ends: nothing went around the proxy, or what did."""
    head = "politeproxy exec:"
    if not names.counts and not addresses.counts and not names.dropped and not addresses.dropped:
        return [f"{head} nothing went around the proxy ({relayed} connection(s) to it)"]
    lines = [f"{head} COMMAND tried to go around the proxy ({relayed} connection(s) to it):"]
    for title, tally in (("names it tried to resolve", names), ("addresses it tried to reach", addresses)):
        if not tally.counts and not tally.dropped:
            continue
        lines.append(f"  {title} (refused):")
        ranked = sorted(tally.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        lines += [f"    {_printable(k)}  x{n}" for k, n in ranked]
        if tally.dropped:
            lines.append(f"    ... and {tally.dropped} more attempt(s) not listed")
    lines.append(f"{head} such a client ignores the proxy settings: see docs/tools.md for its recipe")
    return lines


def _printable(text: str) -> str:
    """A name as a program sent it may hold anything: control characters shown as escapes."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
