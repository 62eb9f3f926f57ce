"""Fair shares of one schedule between pipelines (pure arithmetic: no clock, no I/O).

The discipline is **start-time fair queuing** (SFQ; Goyal, Vin and Cheng, 1996) over slots: every slot costs
1, a pipeline of weight ``w`` advances its finish tag by ``1 / w`` per slot, the next slot goes to the
backlogged pipeline with the smallest start tag ``max(V, finish)``, and the virtual time ``V`` is the start
tag of the slot last handed out. A pipeline that was idle starts at ``V``: it banks nothing, so an hour of
quiet buys no burst, and a pipeline that queued a thousand requests is only ever one slot ahead of a newcomer.

Names are bounded: the configured pipelines plus ``FREE_PIPELINES`` other names keep a name of their own;
a name idle for ``NAME_IDLE`` seconds gives its place up to the next new one (issue 27: names expire instead
of living for the process); while every place is taken by a name in use, a new one is ``other``. The
pacer's fair shares use ``FAIR_NAMES`` places, the metrics' labels fewer (observe/metrics.py): a name
beyond the label cap still gets its own share, and is counted under ``other`` in metrics only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from politeproxy.policy.table import from_table

DEFAULT_PIPELINE = "default"  # the pipeline of callers that name none (tools, tests)
OTHER_PIPELINE = "other"
FREE_PIPELINES = 50  # names beyond the configured ones that keep a metric label of their own, first come
FAIR_NAMES = 1024  # names beyond the configured ones that get a fair share of their own (bounded tables)
NAME_IDLE = 600.0  # seconds a name unused keeps its place (issue 27: 10 minutes)
MAX_NAME = 64  # characters of a pipeline name kept (labels, log lines)


@dataclass(frozen=True)
class PipelineRule:
    """A configured pipeline: ``[pipelines.NAME] weight = 2, max_queued = 500``."""

    name: str
    weight: float = from_table("pipelines.*.weight")
    max_queued: int | None = None  # requests waiting at once; None = no cap of its own


# A name that is already clean: printable ASCII 33..126 without " ' or backslash, at most MAX_NAME long.
_CLEAN = re.compile(rf"[!#-&(-\[\]-~]{{0,{MAX_NAME}}}")


def clean_name(raw: str) -> str:
    """A pipeline name safe for a label and a log line: printable ASCII without spaces or quotes, at most
    ``MAX_NAME`` characters; anything else becomes ``_``. An empty name stays empty (the caller decides)."""
    if _CLEAN.fullmatch(raw):  # the usual case (a client address, a user name): no per-character loop
        return raw
    out = "".join(c if 33 <= ord(c) < 127 and c not in "\"'\\" else "_" for c in raw[:MAX_NAME])
    return out


class PipelineNames:
    """Maps a requested pipeline name to the one it counts as: itself while a place is free, else ``other``.

    ``now`` (seconds, any clock that only moves forward) makes names expire: a name unused for ``idle``
    seconds gives its place up when a new name needs one. Without ``now`` places are first come, for good.
    """

    def __init__(
        self, configured: Iterable[str] = (), free: int = FREE_PIPELINES, idle: float = NAME_IDLE
    ) -> None:
        self.configured = {DEFAULT_PIPELINE, OTHER_PIPELINE, *configured}
        self.free = free
        self.idle = idle
        self.seen: dict[str, float] = {}  # name -> when it was last used (0 without a clock)
        self.expired = 0  # names that gave their place up, all told (a cache of answers must be dropped)

    def configure(self, names: Iterable[str]) -> None:
        self.configured = {DEFAULT_PIPELINE, OTHER_PIPELINE, *names}

    def counted_as(self, raw: str, now: float | None = None) -> str:
        name = clean_name(raw) or DEFAULT_PIPELINE
        if name in self.configured:
            return name
        if name in self.seen:
            if now is not None:
                self.touch(name, now)
            return name
        if len(self.seen) >= self.free and now is not None:
            self._expire(now)
        if len(self.seen) < self.free:
            self.seen[name] = 0.0 if now is None else now
            return name
        return OTHER_PIPELINE

    def touch(self, name: str, now: float) -> None:
        """``name`` was used now (kept in order of last use: the oldest first)."""
        if name in self.seen:
            del self.seen[name]
            self.seen[name] = now

    def _expire(self, now: float) -> None:
        for name, last in list(self.seen.items()):  # oldest first: stops at the first name still in use
            if now - last < self.idle:
                break
            del self.seen[name]
            self.expired += 1


def rules_by_name(rules: Iterable[PipelineRule]) -> dict[str, PipelineRule]:
    return {r.name: r for r in rules}


class FairTags:
    """Start-time fair queuing tags over slots. ``start(p)`` is the tag of p's next slot; ``charge(p)``
    records that p got one. Only pipelines whose finish tag is ahead of ``V`` are kept: any other starts at
    ``V`` anyway, so the table holds at most the pipelines served in about the last round."""

    def __init__(self) -> None:
        self.vtime = 0.0
        self.finish: dict[str, float] = {}
        self.weights: Mapping[str, float] = {}

    def weight(self, pipeline: str) -> float:
        w = self.weights.get(pipeline, 1.0)
        return w if math.isfinite(w) and w > 0 else 1.0

    def start(self, pipeline: str) -> float:
        return max(self.vtime, self.finish.get(pipeline, self.vtime))

    def charge(self, pipeline: str) -> None:
        s = self.start(pipeline)
        self.vtime = s
        self.finish[pipeline] = s + 1.0 / self.weight(pipeline)
        for p in [p for p, f in self.finish.items() if f <= self.vtime]:
            del self.finish[p]  # caught up with V: it would start at V anyway (idle pipelines bank nothing)

    def ahead(self, pipeline: str, own: int, others: Mapping[str, int]) -> dict[str, int]:
        """How many of each other pipeline's ``others[q]`` waiting requests go before a request of
        ``pipeline`` queued now behind ``own`` of its own: those whose start tag is not after its own (ties
        go to the requests already waiting)."""
        target = self.start(pipeline) + own / self.weight(pipeline)
        out: dict[str, int] = {}
        for q, n in others.items():
            if q == pipeline or n <= 0:
                continue
            sq = self.start(q)
            if target < sq:
                continue
            out[q] = min(n, math.floor((target - sq) * self.weight(q) + 1e-9) + 1)
        return out


def least_served(held: Mapping[str, int], waiting: Iterable[str], weight: Mapping[str, float]) -> str | None:
    """For places (exempt reads): the waiting pipeline holding the fewest places per weight; among equals the
    first in ``waiting`` (the caller lists them oldest first)."""
    best: str | None = None
    best_load = math.inf
    for p in waiting:
        w = weight.get(p, 1.0)
        load = held.get(p, 0) / (w if math.isfinite(w) and w > 0 else 1.0)
        if load < best_load:
            best, best_load = p, load
    return best
