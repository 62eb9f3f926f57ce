"""The file store's records as bytes: ccrawl's 16-byte global record and the per-host record.

``ratelimit.lock``: big-endian uint64 UnixNano of the next free slot, then big-endian uint64 count of
grants. ``hosts/<host>``: the fields below. Records are untrusted (ccrawl, a crash, a disk): decoding never
raises. Only a name that passes ``valid_hostname`` becomes a file name; any other gets a hashed one.
"""

from __future__ import annotations

import hashlib
import struct
from functools import lru_cache

from politeproxy.policy.hosts import normalize_host, valid_hostname
from politeproxy.policy.slots import EMPTY_HOST, MAX_THROTTLES, HostState

GLOBAL = struct.Struct(">QQ")
# next_allowed, backoff_until, robots_expires (UnixNano), throttles, crawl_delay (ns): the 40-byte record
# of earlier versions, still read; then blocks, fails, probe_until, adapt_interval (ns), adapt_from,
# adapt_until, tat (UnixNano): 96 bytes, written whole in one pwrite.
HOST_V1 = struct.Struct(">QQQQQ")
HOST = struct.Struct(">QQQQQQQQQQQQ")
NS = 1_000_000_000
U64 = 2**64 - 1
ZERO_HOST = bytes(HOST.size)  # the record of a host with nothing recorded (every field 0)
MAX_HOST_FDS = 64  # open host files kept (LRU); a name a client chose must not cost an fd for good


def _ns(t: float) -> int:
    """Seconds to uint64 nanoseconds; never raises (callers hand sane times, this is the last fence)."""
    if t != t or t <= 0:
        return 0
    return U64 if t >= U64 / NS else round(t * NS)


def _s(ns: int) -> float:
    return ns / NS


def decode_global(data: bytes) -> tuple[float, int] | None:
    """The (next, count) of a 16-byte record, or None for a short one. Never raises: any 16 bytes are two
    uint64s, the time then goes through the sanity bounds."""
    if len(data) < GLOBAL.size:
        return None
    nxt, count = GLOBAL.unpack_from(data)
    return _s(nxt), count


def decode_host(data: bytes) -> HostState | None:
    """The host state of a 96-byte record (or an earlier 40-byte one: the new fields absent), or None for
    a short one. Never raises; the counts are cut just past their bound, so the sanity check sees them."""
    if data == ZERO_HOST:  # the usual record (no step, no backoff): read on every claim, decoded once
        return EMPTY_HOST
    if len(data) < HOST_V1.size:
        return None
    if len(data) < HOST.size:
        data = data[: HOST_V1.size] + bytes(HOST.size - HOST_V1.size)
    nxt, until, robots, throttles, delay, blocks, fails, probe, ai, afrom, auntil, tat = HOST.unpack(
        data[: HOST.size]
    )
    c = MAX_THROTTLES + 1
    return HostState(  # ns / NS inline, not _s(): read on every claim (issue 15: per-request calls)
        nxt / NS, until / NS, min(throttles, c), delay / NS, robots / NS, min(blocks, c), min(fails, c),
        probe / NS, ai / NS, afrom / NS, auntil / NS, tat / NS,
    )  # fmt: skip


def encode_host(st: HostState) -> bytes:
    def n(x: int) -> int:
        return min(max(0, x), U64)

    return HOST.pack(
        _ns(st.next_allowed), _ns(st.backoff_until), _ns(st.robots_expires), n(st.throttles),
        _ns(st.crawl_delay), n(st.blocks), n(st.fails), _ns(st.probe_until), _ns(st.adapt_interval),
        _ns(st.adapt_from), _ns(st.adapt_until), _ns(st.tat),
    )  # fmt: skip


@lru_cache(maxsize=4096)  # a pure function of the name, asked on every claim: bounded, like the fds
def host_file_name(host: str) -> str:
    """The file name for a host: the normalised name when it is RFC 1123 labels, else a hash of it.

    Hashed rather than refused: a StoreError would make the failover store treat a client-chosen name as
    an outage and switch every host to the fallback. ``_`` cannot start a valid name, so no collision."""
    name = normalize_host(host)
    if valid_hostname(name):
        return name
    return "_" + hashlib.sha256(host.encode("utf-8", "surrogatepass")).hexdigest()[:40]
