"""The file store's record of one service's request window (``policy.window``), as bytes.

``windows/<service>``: 16 bytes of header (magic ``PPW1``, then the bucket width as big-endian uint64
nanoseconds, then the bucket count as uint32), then per bucket a big-endian int64 index and a uint32
count. At most ``window.MAX_KEPT`` buckets (1.8 KB), written whole in one pwrite under the store's flock.
Records are untrusted (a crash, a disk, another program): decoding never raises; what it cannot read is
an empty window, and odd counts go to ``window.live``'s bounds.
"""

from __future__ import annotations

import struct

from politeproxy.policy.window import MAX_KEPT, WindowState

MAGIC = b"PPW1"
HEAD = struct.Struct(">4sQI")
BUCKET = struct.Struct(">qI")
NS = 1_000_000_000
SIZE = HEAD.size + MAX_KEPT * BUCKET.size  # the most a record is read


def encode(state: WindowState) -> bytes:
    width = state.width if state.width == state.width and state.width > 0 else 0.0
    kept = state.buckets[-MAX_KEPT:]  # the newest: a live state never holds more
    parts = [HEAD.pack(MAGIC, min(round(width * NS), 2**64 - 1), len(kept))]
    for i, c in kept:
        parts.append(BUCKET.pack(max(-(2**63), min(i, 2**63 - 1)), max(0, min(c, 2**32 - 1))))
    return b"".join(parts)


def decode(data: bytes) -> tuple[WindowState, bool]:
    """The window a record holds, and whether it was well formed (an empty file is: a new window)."""
    if not data:
        return WindowState(), True
    if len(data) < HEAD.size:
        return WindowState(), False
    magic, width_ns, n = HEAD.unpack_from(data)
    if magic != MAGIC or n > MAX_KEPT or len(data) < HEAD.size + n * BUCKET.size:
        return WindowState(), False
    buckets = tuple(BUCKET.unpack_from(data, HEAD.size + k * BUCKET.size) for k in range(n))
    return WindowState(width_ns / NS, buckets), True
