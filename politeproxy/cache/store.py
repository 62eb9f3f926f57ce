"""The disk store: entry files named by a hash of their key, an SQLite index, per-key leases.

Layout under ``<data_dir>/cache``: ``objects/ab/<sha256 of the key>`` (complete entries only, renamed
into place), ``tmp/`` (bodies being written; read only by this process's followers of that download),
``locks/<sha256 of the key>.lease`` (one per key being fetched: the single flight between processes),
``index.sqlite``. No client string ever reaches a path: names are hex digests. Every method blocks: the
proxy calls them from a bounded thread pool, never on its event loop.

A lease is a file created with O_EXCL (atomic on a local disk, and on NFSv3+ too, unlike flock). Its
holder refreshes its mtime every LEASE_REFRESH seconds while it fetches; one not refreshed for
LEASE_STALE seconds belongs to a dead or stuck proxy and is taken over. Nothing waits on a lease in a
thread: a proxy that finds one held polls it from its event loop with a sleep between tries.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from politeproxy.cache.base import CacheError, Meta
from politeproxy.cache.entry import Corrupt, Writer, open_entry, verify
from politeproxy.cache.index import Index
from politeproxy.policy.cacherules import CacheLimits

log = logging.getLogger("politeproxy")
LEASE_REFRESH = 2.0  # seconds between refreshes of a held lease's mtime (wall clock, persisted)
LEASE_STALE = 10.0  # seconds without a refresh after which a lease is a dead proxy's, taken over
_HOST = socket.gethostname()  # a lease names its holder: pid and host
TMP_MAX_AGE = 3600.0  # a temporary body older than this belongs to a dead writer
TOUCH_EVERY = 10.0  # seconds: a hit moves its entry up the LRU at most this often (a write in the index)
INDEX_KIND = "index"  # the kind of the index server's kept answers (issue 43)
TOUCHED_MAX = 4096  # names remembered for that; the table is emptied when full


def key_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Found:
    """A verified entry, its file open at offset 0 (the caller closes it)."""

    f: BinaryIO
    meta: Meta


class DiskStore:
    def __init__(self, root: Path, limits: CacheLimits, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limits = limits
        self.clock = clock
        self.objects, self.tmp, self.locks = root / "objects", root / "tmp", root / "locks"
        try:
            for p in (self.objects, self.tmp, self.locks):
                p.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.index = Index(root / "index.sqlite")
            self._touched: dict[str, float] = {}  # name -> when this process last moved it up the LRU
        except (OSError, Exception) as e:  # sqlite3.Error too: one line for the user
            raise CacheError(f"cache directory {root}: {e}") from None

    def path_for(self, name: str) -> Path:
        return self.objects / name[:2] / name

    def lookup(self, key: str) -> Found | str:
        """The verified entry, or why not: "absent" or "corrupt" (a corrupt entry is dropped here)."""
        name = key_name(key)
        try:
            f, meta, size = open_entry(self.path_for(name), key)
        except FileNotFoundError:
            return "absent"
        except (Corrupt, OSError) as e:
            log.warning("cache entry %s is corrupt (%s): dropped, fetched again", name[:16], e)
            self.drop(name)
            return "corrupt"
        try:
            verify(f, meta)
        except (Corrupt, OSError) as e:
            f.close()
            log.warning("cache entry %s is corrupt (%s): dropped, fetched again", name[:16], e)
            self.drop(name)
            return "corrupt"
        now = self.clock()
        last = self._touched.get(name)
        if last is None or not 0 <= now - last < TOUCH_EVERY:  # a clock stepped back touches again
            if len(self._touched) >= TOUCHED_MAX:
                self._touched.clear()
            try:
                self.index.touch(name, size, now)
            except sqlite3.Error as e:  # a verified entry is still served; only its recency is lost
                log.debug("cache index touch failed: %s", e)
            self._touched[name] = now
        return Found(f, meta)

    def writer(self, key: str) -> Writer:
        return Writer(self.tmp, key_name(key)[:16])

    def commit(
        self,
        w: Writer,
        key: str,
        status: int,
        headers: list[tuple[str, str]],
        length: int,
        kind: str = "",
        stored: float | None = None,
    ) -> list[str]:
        """Finish the body's file and rename it into place; the names evicted to make room for it.
        Raises Corrupt (the file discarded) unless exactly ``length`` body bytes were written. ``kind``:
        "index" for the index server's answers (``clear(kind)``, ``totals(kind)``); ``stored``: when the
        answer was first stored (a copy of another proxy's), else now."""
        name = key_name(key)
        now = self.clock()
        size = w.finish(key, status, headers, now if stored is None else stored, length)
        if size > self.limits.max_size:
            w.path.unlink(missing_ok=True)
            return []
        # The row first: a crash between the two leaves a row without a file (a miss), never a file the
        # size accounting does not see.
        evicted = self.index.add_and_evict(name, size, now, self.limits.max_size, kind)
        dest = self.path_for(name)
        dest.parent.mkdir(exist_ok=True, mode=0o700)
        os.replace(w.path, dest)
        for n in evicted:
            self.path_for(n).unlink(missing_ok=True)
        return evicted

    def drop(self, name: str) -> None:
        self.path_for(name).unlink(missing_ok=True)
        self.index.remove(name)

    def totals(self, kind: str | None = None) -> tuple[int, int]:
        return self.index.totals(kind)

    def clear(self, kind: str | None = None) -> int:
        """Remove every entry, or those of one ``kind`` (readers with an open file finish their answer);
        how many were indexed."""
        names = self.index.clear(kind)
        if kind is not None:
            for n in names:
                self.path_for(n).unlink(missing_ok=True)
            return len(names)
        for d in self.objects.iterdir():
            if d.is_dir() and len(d.name) == 2:
                shutil.rmtree(d, ignore_errors=True)
        return len(names)

    def sweep(self) -> int:
        """Delete temporary bodies of dead writers, stale leases and entry files the index lost (a crash
        between eviction and unlink); how many files went. Run at start, in a thread."""
        gone = 0
        now = time.time()
        for p in self.tmp.glob("*.part"):
            pid = p.name.split("-", 1)[0]
            try:
                old = now - p.stat().st_mtime > TMP_MAX_AGE
                if old or (pid.isdigit() and not _alive(int(pid))):
                    p.unlink(missing_ok=True)
                    gone += 1
            except OSError:
                continue
        for p in self.locks.iterdir():  # dead proxies' leases, and the flock stripes of earlier versions
            try:
                stale = p.name.endswith(".lease") and self._abandoned(p)
                if stale or len(p.name) == 3:
                    p.unlink(missing_ok=True)
                    gone += 1
            except OSError:
                continue
        known = self.index.names()
        for p in self.objects.glob("??/*"):
            try:
                if p.name not in known and now - p.stat().st_mtime > 60:
                    p.unlink(missing_ok=True)
                    gone += 1
            except OSError:
                continue
        return gone

    def lease_path(self, key: str) -> Path:
        return self.locks / f"{key_name(key)}.lease"

    def take_lease(self, key: str) -> bool:
        """Take ``key``'s lease: True when this process now holds it, False when another holds it (a
        stale one, or one whose holder on this host is dead, is taken over). OSError when the directory
        cannot hold leases."""
        path = self.lease_path(key)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                try:
                    if not self._abandoned(path):
                        return False
                except FileNotFoundError:
                    continue  # its holder just let it go: try again
                log.info("cache lease %s abandoned by its holder: taken over", path.name[:16])
                path.unlink(missing_ok=True)
                continue
            try:
                os.write(fd, f"{os.getpid()} {_HOST}\n".encode())
            finally:
                os.close(fd)
            return True
        return False

    @staticmethod
    def _abandoned(path: Path) -> bool:
        """Not refreshed for LEASE_STALE seconds (or dated far ahead: a clock stepped back), or held by a
        process of this host that is gone (kill -9 leaves its lease behind)."""
        age = time.time() - path.stat().st_mtime
        if not -LEASE_STALE <= age <= LEASE_STALE:
            return True
        with open(path, "rb") as f:
            pid, _, host = f.read(300).decode("utf-8", "replace").strip().partition(" ")
        return host == _HOST and pid.isdigit() and not _alive(int(pid))

    def lease_held(self, key: str) -> bool:
        """Whether a fresh lease on ``key`` exists (its holder is fetching it)."""
        try:
            age = time.time() - self.lease_path(key).stat().st_mtime
        except FileNotFoundError:
            return False
        return -LEASE_STALE <= age <= LEASE_STALE

    def refresh_lease(self, key: str) -> None:
        os.utime(self.lease_path(key))

    def drop_lease(self, key: str) -> None:
        self.lease_path(key).unlink(missing_ok=True)

    def close(self) -> None:
        self.index.close()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
