"""Hold notes (``policy.holds``): why each host is held, kept where every proxy sharing the store reads it.

One small interface, three places: this process (memory), the data dir (``holds/<host>.json``, written
whole through a temporary file and a rename, off the event loop), and Redis (``<prefix>hold:<host>``, a
JSON string that expires a day after its hold ends). Notes are advisory: a note that cannot be written or
read is logged once and the hold itself, kept in the store's host record, still applies.
"""

from __future__ import annotations

import asyncio
import json
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from politeproxy.policy.holds import HoldNote, decode
from politeproxy.stores import datadir
from politeproxy.stores.base import WarnOnce
from politeproxy.stores.file_records import host_file_name

MAX_NOTES = 1024  # hosts remembered in memory, and notes kept in holds/, at most (the oldest forgotten)
MAX_NOTE_BYTES = 4096  # a note file or value larger than this is not one
KEEP_AFTER = 86400.0  # a Redis note lives this long past its hold's end


class HoldNotes(ABC):
    """Why each host is held, where every proxy sharing the store reads it; advisory (``put_quietly``,
    ``get_quietly`` log a failure once and carry on)."""

    def __init__(self) -> None:
        self.warn = WarnOnce()

    @abstractmethod
    async def put(self, note: HoldNote) -> None: ...

    @abstractmethod
    async def get(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        """The notes of those of ``hosts`` that have one."""

    async def put_quietly(self, note: HoldNote) -> None:
        try:
            await self.put(note)
        except Exception as e:  # noqa: BLE001 - advisory: the hold itself is in the store's record
            self.warn("put", "could not write the hold note of %s: %r", note.host, e)

    async def get_quietly(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        try:
            return await self.get(hosts)
        except Exception as e:  # noqa: BLE001 - advisory
            self.warn("get", "could not read hold notes: %r", e)
            return {}


class MemoryNotes(HoldNotes):
    """This process alone (the memory backend): at most ``MAX_NOTES`` hosts, the oldest forgotten."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: OrderedDict[str, HoldNote] = OrderedDict()

    async def put(self, note: HoldNote) -> None:
        self.notes.pop(note.host, None)
        self.notes[note.host] = note
        while len(self.notes) > MAX_NOTES:
            self.notes.popitem(last=False)

    async def get(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        return {h: n for h in hosts if (n := self.notes.get(h)) is not None}


def _parse(data: bytes | str | None) -> HoldNote | None:
    if data is None or len(data) > MAX_NOTE_BYTES:
        return None
    try:
        raw: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return decode(raw)


class FileNotes(HoldNotes):
    """``<data_dir>/holds/<host>.json``; the file name is the store's (a hash for any odd name)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.dir = Path(data_dir) / "holds"

    def _path(self, host: str) -> Path:
        return self.dir / f"{host_file_name(host)}.json"

    def _write(self, note: HoldNote) -> None:
        # A checked folder and a rename (stores/datadir.py): a planted symlink is never written through;
        # at most MAX_NOTES notes, the oldest removed first (notes are advisory, the holds are the store's).
        fd = datadir.folder(self.dir.parent, self.dir.name)
        try:
            name = self._path(note.host).name
            if datadir.read_small(fd, name, 0) is None:
                datadir.bounded(fd, MAX_NOTES)
            datadir.replace_whole(fd, name, json.dumps(note.encode()).encode())
        finally:
            os.close(fd)

    def _read(self, hosts: list[str]) -> dict[str, HoldNote]:
        out: dict[str, HoldNote] = {}
        for h in hosts:
            note = _parse(datadir.read_small(None, self._path(h), MAX_NOTE_BYTES + 1))
            if note is not None and note.host == h:
                out[h] = note
        return out

    async def put(self, note: HoldNote) -> None:
        await asyncio.to_thread(self._write, note)

    async def get(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        wanted = list(hosts)
        return await asyncio.to_thread(self._read, wanted) if wanted else {}


class RedisNotes(HoldNotes):
    """``<prefix>hold:<host>``: a JSON string that expires ``KEEP_AFTER`` past its hold's end."""

    def __init__(self, client: Any, prefix: str, clock: Any) -> None:
        super().__init__()
        self.client = client
        self.prefix = prefix
        self.clock = clock

    def _key(self, host: str) -> str:
        return f"{self.prefix}hold:{host}"

    async def put(self, note: HoldNote) -> None:
        ttl = max(1.0, note.until - self.clock()) + KEEP_AFTER
        async with asyncio.timeout(3.0):
            await self.client.set(self._key(note.host), json.dumps(note.encode()), px=round(ttl * 1000))

    async def get(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        wanted = list(hosts)
        if not wanted:
            return {}
        async with asyncio.timeout(3.0):
            values = await self.client.mget([self._key(h) for h in wanted])
        out: dict[str, HoldNote] = {}
        for h, v in zip(wanted, values, strict=False):
            note = _parse(v)
            if note is not None and note.host == h:
                out[h] = note
        return out
