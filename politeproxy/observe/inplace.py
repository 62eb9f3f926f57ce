"""The per-request metrics as numbers updated in place, built into Prometheus families only when scraped.

A grant, a wait, an answer and every relayed chunk each update a metric. prometheus-client's ``Counter``
and ``Histogram`` take a lock and walk their buckets on every update (2-6 µs an event, about 15 µs a
small GET in a loop); here an update is one dict lookup by the raw label key and an add on a small list,
and the families are built when /metrics is scraped (a few times a minute). The text a scrape gives is
the same: names, help, label names and bucket bounds (written as prometheus-client writes them). No lock:
the updates and the scrape all run on the event loop's thread.

    waits = HistogramTable("politeproxy_wait_seconds", "Time held", ("host",), (0.1, 1), hosts)
    waits.observe(("data.commoncrawl.org",), 0.25)
    registry.register(InPlace([waits]))
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from politeproxy.observe.metricparts import MAX_CHILDREN, HostLabels

Key = tuple[str, ...]


class _Table:
    """Cells by label values, each a list of floats; ``_raw`` remembers the cell of each raw key (the
    host and pipeline as the request named them) so the hot path maps no label. The first label is a
    host (mapped by ``hosts``) when ``hosts`` is given, the last a pipeline when ``pipe`` is. The cells
    are bounded by the label mappings; the raw table, keyed by client-chosen names, is cleared at
    ``MAX_CHILDREN`` and whenever a host's label may have changed (``HostLabels.pin``)."""

    width = 1

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str],
        hosts: HostLabels | None = None,
        pipe: Callable[[str], str] | None = None,
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self.hosts = hosts
        self.pipe = pipe
        self.cells: dict[Key, list[float]] = {}
        self._raw: dict[Key, list[float]] = {}
        self._generation = hosts.generation if hosts is not None else 0

    def labels(self, *raw: str) -> list[float]:
        """The cell of a raw key, made at 0 when new (``prepare`` shows configured series at 0 this way)."""
        if self.hosts is not None and self._generation != self.hosts.generation:
            self._raw.clear()
            self._generation = self.hosts.generation
        found = self._raw.get(raw)
        if found is None:
            if len(self._raw) >= MAX_CHILDREN:
                self._raw.clear()
            values = list(raw)
            if self.hosts is not None and values:
                values[0] = self.hosts(values[0])
            if self.pipe is not None and values:
                values[-1] = self.pipe(values[-1])
            found = self.cells.setdefault(tuple(values), [0.0] * self.width)
            self._raw[raw] = found
        return found

    def family(self) -> Metric:
        raise NotImplementedError


class CountTable(_Table):
    """A counter family (``NAME_total``), one number a label set."""

    def inc(self, key: Key, amount: float = 1.0) -> None:
        cell = self._raw.get(key)
        if cell is None or (self.hosts is not None and self._generation != self.hosts.generation):
            cell = self.labels(*key)
        cell[0] += amount

    def family(self) -> Metric:
        f = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, cell in self.cells.items():
            f.add_metric(values, cell[0])
        return f


class HistogramTable(_Table):
    """A histogram family. A cell holds each bucket's own count (not cumulative) and, last, the sum; a
    value lands in the first bucket whose bound is at or above it, as Prometheus' ``le`` says. NaN is not
    counted (prometheus-client's ``observe`` would count it in no bucket yet add it to the sum)."""

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str],
        buckets: Iterable[float],
        hosts: HostLabels | None = None,
        pipe: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(name, doc, labelnames, hosts, pipe)
        self.bounds = (*sorted(float(b) for b in buckets if b != math.inf), math.inf)
        self._les = [floatToGoString(b) for b in self.bounds]
        self.width = len(self.bounds) + 1

    def observe(self, key: Key, v: float) -> None:
        if v != v:
            return
        cell = self._raw.get(key)
        if cell is None or (self.hosts is not None and self._generation != self.hosts.generation):
            cell = self.labels(*key)
        cell[bisect_left(self.bounds, v)] += 1
        cell[-1] += v

    def count(self, *raw: str) -> float:
        return sum(self.labels(*raw)[:-1])

    def family(self) -> Metric:
        f = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, cell in self.cells.items():
            running, buckets = 0.0, []
            for le, n in zip(self._les, cell, strict=False):
                running += n
                buckets.append((le, running))
            f.add_metric(values, buckets, sum_value=cell[-1])
        return f


class InPlace(Collector):
    """The tables' families for a registry, built at each scrape."""

    def __init__(self, tables: Iterable[_Table]) -> None:
        self.tables = list(tables)

    def collect(self) -> Iterable[Metric]:
        for t in self.tables:
            yield t.family()
