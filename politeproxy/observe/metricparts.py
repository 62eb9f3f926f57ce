"""The bounded pieces the metrics are built from: host labels with a cap, and the achieved-rate window.

Memory stays bounded whatever clients send: the host label takes the pinned hosts and the first
``FREE_HOST_LABELS`` other names seen, then ``other``; a rate window keeps 100 slices, trimmed on every add.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

# The achieved-rate gauge's window; POLITEPROXY_RATE_WINDOW shortens it (tests, quick dashboards).
RATE_WINDOW = float(os.environ.get("POLITEPROXY_RATE_WINDOW", "60") or 60)
RATE_BUCKETS = 100  # the window's resolution: the gauge is within 1% of an exact count
OTHER = "other"  # the host label of every non-paced host, and of paced names beyond the cap
PINNED_HOSTS = ("index.commoncrawl.org", "data.commoncrawl.org")
FREE_HOST_LABELS = 50  # names beyond the pinned ones that get a label of their own, first come
# Cells an in-place table (observe.inplace) remembers by the raw (host, ...) key: the raw host is
# client-chosen, so the table is cleared when it reaches this size (the label values are bounded already).
MAX_CHILDREN = 1024


class HostLabels:
    """Maps a host to its label value: itself while the cap allows, else ``other``."""

    def __init__(self, pinned: Iterable[str] = PINNED_HOSTS, free: int = FREE_HOST_LABELS) -> None:
        self.pinned = {OTHER, *pinned}
        self.free = free
        self.seen: set[str] = set()
        self.generation = 0  # bumped when a host's label may change (pin), so remembered children go

    def pin(self, hosts: Iterable[str]) -> None:
        self.pinned.update(hosts)
        self.generation += 1

    def __call__(self, host: str) -> str:
        if host in self.pinned or host in self.seen:
            return host
        if len(self.seen) < self.free:
            self.seen.add(host)
            return host
        return OTHER


M = TypeVar("M", Counter, Gauge, Histogram)


class HostLabelled(Generic[M]):
    """A labelled metric whose first label is a host, capped by ``HostLabels``. The per-request families
    are ``observe.inplace`` tables instead; these are the ones updated now and then (throttles, backoff,
    queue depth, refusals)."""

    def __init__(self, metric: M, label: HostLabels) -> None:
        self.metric: M = metric
        self.label = label

    def labels(self, host: str, *rest: str) -> M:
        return self.metric.labels(self.label(host), *rest)


class RateWindow:
    """Events per second over the last ``window`` seconds, in ``buckets`` slices: memory stays bounded
    whatever the rate, and nothing depends on a scrape to trim it."""

    def __init__(self, window: float = RATE_WINDOW, buckets: int = RATE_BUCKETS) -> None:
        self.window = window
        self.width = window / buckets
        self.slices: deque[list[int]] = deque()  # [slice index, events in it], oldest first

    def add(self, now: float) -> None:
        idx = math.floor(now / self.width)
        if self.slices and self.slices[-1][0] == idx:
            self.slices[-1][1] += 1
        else:  # trimming only when a slice starts keeps the bound (count() trims before it sums)
            self.slices.append([idx, 1])
            self.trim(now)

    def trim(self, now: float) -> None:
        oldest = math.floor((now - self.window) / self.width)
        while self.slices and self.slices[0][0] <= oldest:
            self.slices.popleft()

    def count(self, now: float) -> int:
        self.trim(now)
        return sum(n for _i, n in self.slices)

    def count_since(self, now: float, seconds: float) -> int:
        """Events in the last ``seconds`` (whole slices: at most one slice more)."""
        oldest = math.floor((now - seconds) / self.width)
        return sum(n for i, n in self.slices if i > oldest)


def summed(label: str, host: str, value: int, others: dict[str, int]) -> int:
    """The gauge value for ``label``: the host's own, or the sum over every host labelled ``other``."""
    if label != OTHER or host == OTHER:
        return value
    if value:
        others[host] = value
    else:
        others.pop(host, None)
    return sum(others.values())
