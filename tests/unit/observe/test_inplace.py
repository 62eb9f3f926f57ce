"""The in-place tables (observe/inplace.py) scrape as prometheus-client's own Counter and Histogram would."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from politeproxy.observe.inplace import CountTable, HistogramTable, InPlace
from politeproxy.observe.metricparts import MAX_CHILDREN, OTHER, HostLabels
from politeproxy.observe.metrics import WAIT_BUCKETS

HOSTS = ["data.commoncrawl.org", "a.example", "b.example", "c.example"]
values = st.one_of(
    st.floats(min_value=0, max_value=100, allow_nan=False),
    st.sampled_from([*WAIT_BUCKETS, 0.0, math.inf]),  # the bounds themselves: le means "at or below"
)


def text(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line for line in lines if not line.startswith("#"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(HOSTS), st.sampled_from(["x", "y"]), values), max_size=60))
def test_the_tables_scrape_as_prometheus_client_counts(events: list[tuple[str, str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = HostLabels(pinned=["data.commoncrawl.org"], free=1)  # the rest share "other"
    count = CountTable("t_requests", "doc", ["host", "pipeline"], labels, str.upper)
    hist = HistogramTable("t_wait_seconds", "doc", ["host", "pipeline"], WAIT_BUCKETS, labels, str.upper)
    ours.register(InPlace([count, hist]))
    c = Counter("t_requests", "doc", ["host", "pipeline"], registry=theirs)
    h = Histogram("t_wait_seconds", "doc", ["host", "pipeline"], buckets=WAIT_BUCKETS, registry=theirs)
    mirror = HostLabels(pinned=["data.commoncrawl.org"], free=1)
    for host, pipe, v in events:
        count.inc((host, pipe))
        hist.observe((host, pipe), v)
        c.labels(mirror(host), pipe.upper()).inc()
        h.labels(mirror(host), pipe.upper()).observe(v)
    assert [x for x in text(ours) if "_created" not in x] == [x for x in text(theirs) if "_created" not in x]


def test_a_pin_moves_later_counts_to_the_host_own_label() -> None:
    labels = HostLabels(pinned=[], free=0)
    t = CountTable("t", "doc", ["host"], labels)
    t.inc(("late.example",))
    labels.pin(["late.example"])
    t.inc(("late.example",))
    assert t.cells == {(OTHER,): [1.0], ("late.example",): [1.0]}


def test_nan_is_not_counted_and_raw_keys_stay_bounded() -> None:
    t = HistogramTable("t", "doc", ["host"], (1.0,), HostLabels(pinned=[], free=0))
    t.observe(("h",), math.nan)
    assert t.count("h") == 0
    for i in range(3 * MAX_CHILDREN):  # client-chosen names: the raw table is cleared, the cells are one
        t.observe((f"h{i}.example",), 0.5)
    assert len(t._raw) <= MAX_CHILDREN and list(t.cells) == [(OTHER,)]
    assert t.count("anything") == 3 * MAX_CHILDREN
