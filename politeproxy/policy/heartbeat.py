"""Heartbeats (issue 27 item 2): each proxy announces itself in the shared store every ``BEAT_EVERY``
seconds; a record older than ``LIVE_FOR`` (three beats) is not live.

Pure: records are built, encoded, decoded and judged here with the caller's clock. A record is written by
another process and may be damaged: ``decode`` never raises, bounds every string and list, and answers
None for anything that is not a record. Nothing in a record names a path (stores key files by a hash of
the id).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from politeproxy.policy.fairness import clean_name

BEAT_EVERY = 2.0  # seconds between beats
LIVE_FOR = 3 * BEAT_EVERY  # a record older than this is not live
DROP_AFTER = 60.0  # a stale record older than this is removed by whoever reads it
MAX_PROXIES = 64  # records read (and listed) at most
MAX_PIPELINES = 20  # pipelines in one record's summary at most
MAX_TEXT = 128  # characters of the id, listen address and version kept
MAX_RECORD_BYTES = 8192  # a stored value longer than this is not a record
MAX_QUEUE = 10**9  # a queue length beyond this is damage


def _text(x: Any) -> str | None:
    """A printable bounded string, or None."""
    if not isinstance(x, str) or not x:
        return None
    return "".join(c if 32 < ord(c) < 127 else "_" for c in x[:MAX_TEXT])


def _time(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)


def _count(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        return 0
    return min(max(0, x), MAX_QUEUE)


def proxy_id(host: str, pid: int, started: float) -> str:
    """host + pid + start time: unique across restarts, readable in a status row."""
    return _text(f"{host}:{pid}:{int(started)}") or "proxy"


@dataclass(frozen=True)
class Beat:
    id: str
    listen: str
    version: str
    at: float  # wall clock of the writer when it beat
    started: float  # wall clock of the writer's start
    queued: int = 0  # paced requests waiting, all pipelines
    pipelines: tuple[tuple[str, int], ...] = ()  # (name, queued), longest queues first, bounded
    pipelines_omitted: int = 0

    def encode(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "listen": self.listen,
            "version": self.version,
            "at": round(self.at, 3),
            "started": round(self.started, 3),
            "queued": self.queued,
            "pipelines": [[n, q] for n, q in self.pipelines],
            "pipelines_omitted": self.pipelines_omitted,
        }

    def age(self, now: float) -> float:
        return max(0.0, now - self.at)

    def live(self, now: float, live_for: float = LIVE_FOR) -> bool:
        # A record from the future (clock skew beyond a beat) is not trusted as live forever.
        return -live_for <= now - self.at <= live_for

    def row(self, now: float, me: str | None = None) -> dict[str, Any]:
        """The record as a /status ``proxies`` row."""
        return {
            "id": self.id,
            "listen": self.listen,
            "version": self.version,
            "self": self.id == me,
            "last_beat_s": round(self.age(now), 1),
            "uptime_s": round(max(0.0, now - self.started), 1),
            "queued": self.queued,
            "pipelines": [{"pipeline": n, "queued": q} for n, q in self.pipelines],
            "pipelines_omitted": self.pipelines_omitted,
        }


def summary(
    queued_by_pipeline: Mapping[str, int], names: Iterable[str] = ()
) -> tuple[tuple[tuple[str, int], ...], int]:
    """Every pipeline known (queued or not), longest queues first, at most ``MAX_PIPELINES``, names clean."""
    q: dict[str, int] = {}
    for n in [*queued_by_pipeline, *names]:
        c = clean_name(str(n)) or "_"
        q[c] = max(q.get(c, 0), _count(queued_by_pipeline.get(n, 0)))
    rows = sorted(q.items(), key=lambda r: (-r[1], r[0]))
    return tuple(rows[:MAX_PIPELINES]), max(0, len(rows) - MAX_PIPELINES)


def make_beat(
    id: str,
    listen: str,
    version: str,
    at: float,
    started: float,
    queued_by_pipeline: Mapping[str, int],
    names: Iterable[str] = (),
) -> Beat:
    rows, omitted = summary(queued_by_pipeline, names)
    total = min(sum(_count(v) for v in queued_by_pipeline.values()), MAX_QUEUE)
    text = [_text(id) or "proxy", _text(listen) or "-", _text(version) or "-"]
    return Beat(text[0], text[1], text[2], at, started, total, rows, omitted)


def _pipelines(raw: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list):
        return ()
    out: list[tuple[str, int]] = []
    for item in raw[:MAX_PIPELINES]:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            out.append((clean_name(item[0]) or "_", _count(item[1])))
    return tuple(out)


def decode(raw: Any) -> Beat | None:
    """A record read from the store, or None when it is not one. Never raises."""
    if not isinstance(raw, dict):
        return None
    ident, at, started = _text(raw.get("id")), _time(raw.get("at")), _time(raw.get("started"))
    if ident is None or at is None or started is None:
        return None
    return Beat(
        ident,
        _text(raw.get("listen")) or "-",
        _text(raw.get("version")) or "-",
        at,
        started,
        _count(raw.get("queued")),
        _pipelines(raw.get("pipelines")),
        _count(raw.get("pipelines_omitted")),
    )


def live(beats: Iterable[Beat], now: float, live_for: float = LIVE_FOR) -> list[Beat]:
    """The live records, one per id (the newest), at most ``MAX_PROXIES``, sorted by id."""
    by_id: dict[str, Beat] = {}
    for b in beats:
        if b.live(now, live_for) and (b.id not in by_id or by_id[b.id].at < b.at):
            by_id[b.id] = b
    return sorted(by_id.values(), key=lambda b: b.id)[:MAX_PROXIES]


def multiplier(floor: float, last_live: int) -> float:
    """The degraded-mode gap multiplier: the live count last seen, never below ``expected_proxies``."""
    return max(1.0, float(floor), float(last_live))
