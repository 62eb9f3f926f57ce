"""The file store's record of one service's request window (``policy.window``), as bytes.

``windows/<service>``: a header, then per bucket a big-endian int64 index and a uint32 count. The header
is magic ``PPW2``, the bucket width as big-endian uint64 nanoseconds, the bucket count as uint32, then the
stamp: the wall clock's offset from the boot clock (int64 ns, wall - CLOCK_BOOTTIME), the boot's id
(uint64, 0 unknown) and the wall time (uint64 ns) when the record was written. A reader on the same boot
whose offset differs has seen the wall clock step by the difference since, and moves the buckets with it
(``window.shifted``): a forward step cannot age the counts. ``PPW1`` records (16 bytes of header, no
stamp) are still read.

At most ``window.MAX_KEPT`` buckets (1.8 KB), written whole in one pwrite under the store's flock.
Records are untrusted (a crash, a disk, another program): decoding never raises; what it cannot read is
an empty window, and odd counts go to ``window.live``'s bounds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from politeproxy.policy.window import MAX_KEPT, WindowState

MAGIC = b"PPW1"
MAGIC2 = b"PPW2"
HEAD = struct.Struct(">4sQI")
STAMP = struct.Struct(">qQQ")
BUCKET = struct.Struct(">qI")
NS = 1_000_000_000
SIZE = HEAD.size + STAMP.size + MAX_KEPT * BUCKET.size  # the most a record is read
I64 = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Stamp:
    """The clocks when a record was written: wall - boot clock (s), the boot (0: unknown), the wall time."""

    offset: float
    boot: int
    written: float = 0.0

    def step_since(self, now: Stamp) -> float:
        """How far the wall clock stepped between this stamp and ``now`` (0 when that cannot be told)."""
        if self.boot == 0 or self.boot != now.boot:
            return 0.0
        return now.offset - self.offset


def encode(state: WindowState, stamp: Stamp | None = None) -> bytes:
    width = state.width if state.width == state.width and state.width > 0 else 0.0
    kept = state.buckets[-MAX_KEPT:]  # the newest: a live state never holds more
    magic = MAGIC if stamp is None else MAGIC2
    parts = [HEAD.pack(magic, min(round(width * NS), 2**64 - 1), len(kept))]
    if stamp is not None:
        off = stamp.offset * NS if stamp.offset == stamp.offset else 0.0
        at = stamp.written * NS if stamp.written == stamp.written else 0.0
        ns = (round(max(-I64, min(off, I64))), stamp.boot & (2**64 - 1), round(max(0.0, min(at, I64))))
        parts.append(STAMP.pack(*ns))
    for i, c in kept:
        parts.append(BUCKET.pack(max(-(2**63), min(i, 2**63 - 1)), max(0, min(c, 2**32 - 1))))
    return b"".join(parts)


def decode_stamped(data: bytes) -> tuple[WindowState, bool, Stamp | None]:
    """The window a record holds, whether it was well formed (an empty file is: a new window), and its
    stamp (None for a PPW1 record or a bad one)."""
    if not data:
        return WindowState(), True, None
    if len(data) < HEAD.size:
        return WindowState(), False, None
    magic, width_ns, n = HEAD.unpack_from(data)
    at, stamp = HEAD.size, None
    if magic == MAGIC2 and len(data) >= HEAD.size + STAMP.size:
        off, boot, written = STAMP.unpack_from(data, HEAD.size)
        stamp, at = Stamp(off / NS, boot, written / NS), HEAD.size + STAMP.size
    elif magic != MAGIC:
        return WindowState(), False, None
    if n > MAX_KEPT or len(data) < at + n * BUCKET.size:
        return WindowState(), False, None
    buckets = tuple(BUCKET.unpack_from(data, at + k * BUCKET.size) for k in range(n))
    return WindowState(width_ns / NS, buckets), True, stamp


def decode(data: bytes) -> tuple[WindowState, bool]:
    state, ok, _ = decode_stamped(data)
    return state, ok
