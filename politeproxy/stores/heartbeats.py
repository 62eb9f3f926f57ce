"""Where heartbeats (``policy.heartbeat``) are kept: beside the schedule, so every proxy sharing it sees them.

- memory: this process alone;
- data dir: ``proxies/<hash of the id>.json``, one file per proxy, written whole through a temporary file
  and a rename (each proxy writes only its own file, so no lock is needed); a reader lists at most
  ``MAX_FILES`` entries, reads at most ``MAX_RECORD_BYTES`` of each, ignores what does not decode, and
  removes records (its own kind of name only) stale for ``DROP_AFTER``;
- Redis: ``<prefix>beat:<hash>`` (a JSON string with a TTL of ``LIVE_FOR``) and the index
  ``<prefix>beats`` (a sorted set of those hashes by beat time, trimmed past ``DROP_AFTER`` and to
  ``MAX_PROXIES``).

File operations run off the event loop. A failure raises to the caller, which logs it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import Any

from politeproxy.policy.heartbeat import DROP_AFTER, LIVE_FOR, MAX_PROXIES, MAX_RECORD_BYTES, Beat, decode
from politeproxy.stores import datadir

MAX_FILES = 4 * MAX_PROXIES  # directory entries looked at per read
_NAME = re.compile(r"[0-9a-f]{32}\.json")
_HASH = re.compile(r"[0-9a-f]{32}")


def beat_key(ident: str) -> str:
    """The name a record is stored under: a hash, so no id ever becomes a path or a key pattern."""
    return hashlib.sha256(ident.encode("utf-8", "replace")).hexdigest()[:32]


def parse(data: bytes | str | None) -> Beat | None:
    if data is None or len(data) > MAX_RECORD_BYTES:
        return None
    try:
        raw: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return decode(raw)


def alone(count: int) -> float:
    """The live count told to a store without a fallback: its gap multiplier stays 1."""
    return 1.0


class Beats(ABC):
    """Where every proxy's heartbeat is kept: beside the schedule, so every proxy sharing it sees them."""

    @abstractmethod
    async def put(self, beat: Beat) -> None: ...

    @abstractmethod
    async def read(self, now: float) -> list[Beat]:
        """Every record found (live or not; the caller judges), bounded."""

    async def drop(self, ident: str) -> None:  # noqa: B027 - optional: a clean stop leaves at once
        pass


class MemoryBeats(Beats):
    """This process alone (the memory backend): only its own beat is ever read."""

    def __init__(self) -> None:
        self.beats: dict[str, Beat] = {}

    async def put(self, beat: Beat) -> None:
        self.beats[beat.id] = beat
        while len(self.beats) > MAX_PROXIES:
            del self.beats[next(iter(self.beats))]

    async def read(self, now: float) -> list[Beat]:
        return list(self.beats.values())

    async def drop(self, ident: str) -> None:
        self.beats.pop(ident, None)


class FileBeats(Beats):
    """``<data_dir>/proxies/``: one file per proxy on the machine, written whole (see the module's text)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "proxies"

    def _path(self, ident: str) -> Path:
        return self.dir / f"{beat_key(ident)}.json"

    def _write(self, beat: Beat) -> None:
        fd = datadir.folder(self.dir.parent, self.dir.name)  # checked: never written through a symlink
        try:
            datadir.replace_whole(fd, self._path(beat.id).name, json.dumps(beat.encode()).encode())
        finally:
            os.close(fd)

    def _read(self, now: float) -> list[Beat]:
        out: list[Beat] = []
        try:
            entries = os.scandir(self.dir)
        except FileNotFoundError:
            return out
        with entries:
            for n, entry in enumerate(entries):
                if n >= MAX_FILES:
                    break
                if not _NAME.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    beat = parse(datadir.read_small(None, entry.path, MAX_RECORD_BYTES + 1))
                    stale = beat is None or now - beat.at > DROP_AFTER
                    if stale and now - entry.stat(follow_symlinks=False).st_mtime > DROP_AFTER:
                        os.unlink(entry.path)  # damaged or long dead: whoever reads it clears it
                        continue
                except OSError:
                    continue
                if beat is not None:
                    out.append(beat)
        return out

    def _unlink(self, ident: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(ident))

    async def put(self, beat: Beat) -> None:
        await asyncio.to_thread(self._write, beat)

    async def read(self, now: float) -> list[Beat]:
        return await asyncio.to_thread(self._read, now)

    async def drop(self, ident: str) -> None:
        await asyncio.to_thread(self._unlink, ident)


class RedisBeats(Beats):
    """``<prefix>beat:<hash>`` keys with a TTL and the ``<prefix>beats`` index: every proxy on the server."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.index = f"{prefix}beats"

    def _key(self, h: str) -> str:
        return f"{self.prefix}beat:{h}"

    async def put(self, beat: Beat) -> None:
        h = beat_key(beat.id)
        async with asyncio.timeout(3.0):
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self._key(h), json.dumps(beat.encode()), px=round(LIVE_FOR * 1000))
            pipe.zadd(self.index, {h: beat.at})
            pipe.zremrangebyscore(self.index, "-inf", beat.at - DROP_AFTER)
            pipe.zremrangebyrank(self.index, 0, -(MAX_PROXIES + 1))  # the newest MAX_PROXIES stay
            pipe.pexpire(self.index, round(DROP_AFTER * 1000))
            await pipe.execute()

    async def read(self, now: float) -> list[Beat]:
        """The records whose keys have not expired. Their age is the server's (from the key's TTL), not
        the writer's clock against ours: machines whose clocks disagree still agree on who is live."""
        async with asyncio.timeout(3.0):
            hashes = await self.client.zrevrange(self.index, 0, MAX_PROXIES - 1)
            if not hashes:
                return []
            names = [h.decode("ascii", "replace") if isinstance(h, bytes) else str(h) for h in hashes]
            names = [h for h in names if _HASH.fullmatch(h)]  # a member not of our making names no key
            if not names:
                return []
            pipe = self.client.pipeline(transaction=False)
            for h in names:
                key = self._key(h)
                pipe.get(key)
                pipe.pttl(key)
            answers = await pipe.execute()
        out: list[Beat] = []
        for value, pttl in zip(answers[::2], answers[1::2], strict=False):
            beat = parse(value)
            if beat is None or not isinstance(pttl, int) or pttl < 0:
                continue
            age = max(0.0, LIVE_FOR - pttl / 1000)
            out.append(replace(beat, at=now - age))
        return out

    async def drop(self, ident: str) -> None:
        h = beat_key(ident)
        async with asyncio.timeout(3.0):
            await self.client.delete(self._key(h))
            await self.client.zrem(self.index, h)
