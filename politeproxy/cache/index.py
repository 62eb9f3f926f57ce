"""The cache's index: one SQLite table (name, size, last used) shared by every process on the data dir.

SQLite (stdlib) gives the cross-process part for free: a write transaction (``BEGIN IMMEDIATE``) makes
"add this entry, then evict the least recently used until the total fits" atomic between proxies, and
WAL lets hits read while another process writes. The files are the truth for content; the index is the
truth for size and recency. Times are wall-clock seconds (persisted: never time.monotonic()).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

BUSY_TIMEOUT = 10.0  # seconds a statement waits for another process's write transaction
EVICT_BATCH = 64


class Index:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        self.lock = threading.Lock()  # one connection, used from the cache's threads one at a time
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS entries (name TEXT PRIMARY KEY, size INTEGER NOT NULL,"
                " used REAL NOT NULL)"
            )
            self.db.execute("CREATE INDEX IF NOT EXISTS entries_used ON entries (used)")
            # issue 43: which entries are the index server's answers ("index"): `cache clear --index`
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(entries)")}
            if "kind" not in columns:  # an index an earlier version made
                self.db.execute("ALTER TABLE entries ADD COLUMN kind TEXT NOT NULL DEFAULT ''")

    def touch(self, name: str, size: int, now: float) -> None:
        """A hit: the entry is the most recently used (added back if another process lost its row)."""
        with self.lock:
            self.db.execute(
                "INSERT INTO entries (name, size, used) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET used = excluded.used, size = excluded.size",
                (name, size, now),
            )

    def add_and_evict(self, name: str, size: int, now: float, max_size: int, kind: str = "") -> list[str]:
        """Record the entry, then remove the least recently used others until the total is within
        ``max_size``; the names removed (their files are the caller's to delete). One transaction."""
        evicted: list[str] = []
        with self.lock:
            db = self.db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO entries (name, size, used, kind) VALUES (?, ?, ?, ?) ON CONFLICT (name)"
                    " DO UPDATE SET used = excluded.used, size = excluded.size, kind = excluded.kind",
                    (name, size, now, kind),
                )
                total = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
                while total > max_size:
                    rows = db.execute(
                        "SELECT name, size FROM entries WHERE name != ? ORDER BY used LIMIT ?",
                        (name, EVICT_BATCH),
                    ).fetchall()
                    if not rows:
                        break
                    for n, s in rows:
                        if total <= max_size:
                            break
                        db.execute("DELETE FROM entries WHERE name = ?", (n,))
                        evicted.append(n)
                        total -= s
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return evicted

    def remove(self, name: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM entries WHERE name = ?", (name,))

    def totals(self, kind: str | None = None) -> tuple[int, int]:
        """(entries, bytes) over every process's entries (of one ``kind`` only, when given)."""
        q, args = "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries", tuple[str, ...]()
        if kind is not None:
            q, args = q + " WHERE kind = ?", (kind,)
        with self.lock:
            n, b = self.db.execute(q, args).fetchone()
        return int(n), int(b)

    def names(self) -> set[str]:
        with self.lock:
            return {r[0] for r in self.db.execute("SELECT name FROM entries")}

    def clear(self, kind: str | None = None) -> list[str]:
        """Remove every row (of one ``kind`` only, when given); the names removed."""
        where, args = ("", tuple[str, ...]()) if kind is None else (" WHERE kind = ?", (kind,))
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            names = [r[0] for r in self.db.execute("SELECT name FROM entries" + where, args)]
            self.db.execute("DELETE FROM entries" + where, args)
            self.db.execute("COMMIT")
        return names

    def close(self) -> None:
        with self.lock:
            self.db.close()
