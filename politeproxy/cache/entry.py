"""One entry's file: the body, then its head (JSON), the head's length and a magic number.

The head goes last because the body's length and CRC-32 are known only once it has streamed through.
A reader checks the magic, that the file is exactly body + head + trailer long, that the head names the
key it was looked up by, and (``verify``) the body's CRC-32 before the first byte goes out. Every check
that fails makes the entry corrupt: it is dropped and fetched again, never served.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import BinaryIO

from politeproxy.cache.base import Meta
from politeproxy.policy.cacherules import STORED_HEADERS, parse_content_range

MAGIC = b"PPC1"
TRAILER = struct.Struct(">I4s")  # head length, magic
MAX_HEAD = 64 * 1024
VERIFY_CHUNK = 1 << 20
_ALLOWED = {h.lower(): h for h in STORED_HEADERS}


class Corrupt(Exception):
    """The entry's file fails a check: drop it."""


class Writer:
    """A body streaming into a temporary file (blocking calls: run them in a thread)."""

    def __init__(self, tmp_dir: Path, name: str) -> None:
        self.path = tmp_dir / f"{os.getpid()}-{name}-{os.urandom(6).hex()}.part"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.f: BinaryIO = os.fdopen(fd, "wb", buffering=0)
        self.crc = 0
        self.count = 0
        # Calls come from a pool of threads: a commit must not overtake the last write.
        self.lock = threading.Lock()

    def write(self, chunk: bytes) -> None:
        with self.lock:
            if self.f.closed:
                return
            self.f.write(chunk)
            self.crc = zlib.crc32(chunk, self.crc)
            self.count += len(chunk)

    def finish(
        self, key: str, status: int, headers: list[tuple[str, str]], stored: float, length: int
    ) -> int:
        """Append the head and close; the file's size. Raises Corrupt (and discards) unless exactly
        ``length`` body bytes were written."""
        with self.lock:
            if self.f.closed or self.count != length:
                self._discard()
                raise Corrupt(f"{self.count} body bytes written, {length} expected")
            return self._finish(key, status, headers, stored)

    def _finish(self, key: str, status: int, headers: list[tuple[str, str]], stored: float) -> int:
        head = json.dumps(
            {
                "key": key,
                "status": status,
                "headers": headers,
                "length": self.count,
                "crc": self.crc,
                "stored": stored,
            },
            separators=(",", ":"),
        ).encode()
        self.f.write(head + TRAILER.pack(len(head), MAGIC))
        self.f.close()
        return self.count + len(head) + TRAILER.size

    def discard(self) -> None:
        with self.lock:
            self._discard()

    def _discard(self) -> None:
        try:
            self.f.close()
        finally:
            self.path.unlink(missing_ok=True)


def _meta(raw: object, key: str) -> Meta:
    """The head as Meta; anything not exactly the expected shape is Corrupt (store records are untrusted)."""
    if not isinstance(raw, dict):
        raise Corrupt("head is not an object")
    status, length, crc, stored = raw.get("status"), raw.get("length"), raw.get("crc"), raw.get("stored")
    if raw.get("key") != key:
        raise Corrupt("head names another key")
    if not isinstance(status, int) or status not in (200, 206, 404):  # 404: a kept "No Captures found"
        raise Corrupt("bad status")
    if not isinstance(length, int) or not isinstance(crc, int) or length < 0 or not 0 <= crc < 2**32:
        raise Corrupt("bad length or crc")
    if not isinstance(stored, int | float) or not math.isfinite(stored):
        raise Corrupt("bad stored time")
    headers = raw.get("headers")
    if not isinstance(headers, list) or len(headers) > len(_ALLOWED):
        raise Corrupt("bad headers")
    out = []
    for h in headers:
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)):
            raise Corrupt("bad header")
        name, value = h
        if name.lower() not in _ALLOWED or len(value) > 8192 or not value.isprintable():
            raise Corrupt("bad header")
        out.append((_ALLOWED[name.lower()], value))
    # A hit's head announces the body it sends: a GET's Content-Length must be its length; a HEAD has none.
    fields = dict(out)
    announced = fields.get("Content-Length")
    if key.startswith("HEAD ") and length != 0:
        raise Corrupt("a HEAD entry with a body")
    if not key.startswith("HEAD ") and announced != str(length):
        raise Corrupt("Content-Length does not match the body")
    cr = parse_content_range(fields.get("Content-Range", ""))
    if (status == 206) != (cr is not None) or (cr is not None and announced != str(cr[1] - cr[0] + 1)):
        raise Corrupt("Content-Range does not match the status or the length")
    return Meta(key, status, tuple(out), length, crc, float(stored))


def open_entry(path: Path, key: str) -> tuple[BinaryIO, Meta, int]:
    """The open file (at offset 0), its head and its size; FileNotFoundError when absent, else Corrupt."""
    f = open(path, "rb", buffering=0)  # noqa: SIM115 - handed to the caller, who closes it
    try:
        size = os.fstat(f.fileno()).st_size
        if size < TRAILER.size:
            raise Corrupt("shorter than its trailer")
        f.seek(size - TRAILER.size)
        head_len, magic = TRAILER.unpack(f.read(TRAILER.size))
        if magic != MAGIC or head_len > MAX_HEAD or head_len + TRAILER.size > size:
            raise Corrupt("bad trailer")
        f.seek(size - TRAILER.size - head_len)
        try:
            raw = json.loads(f.read(head_len))
        except (ValueError, UnicodeDecodeError):
            raise Corrupt("head is not JSON") from None
        meta = _meta(raw, key)
        if meta.length + head_len + TRAILER.size != size:
            raise Corrupt("length does not match the file")
        f.seek(0)
        return f, meta, size
    except BaseException:
        f.close()
        raise


def verify(f: BinaryIO, meta: Meta) -> None:
    """Read the body once for its CRC-32 (page cache makes the serving read cheap); Corrupt on mismatch."""
    f.seek(0)
    crc, left = 0, meta.length
    while left > 0:
        chunk = f.read(min(VERIFY_CHUNK, left))
        if not chunk:
            raise Corrupt("body ends early")
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    if crc != meta.crc:
        raise Corrupt("checksum mismatch")
    f.seek(0)
