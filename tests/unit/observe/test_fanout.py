"""observe/fanout.py (issue 44 item 3): an event declared once on its family reaches every sink that
overrides it, in order; a sink's inherited no-op (its own family's or another's) is left out; one sink
left is bound directly (no call in between)."""

from __future__ import annotations

from politeproxy.cache.base import CacheEvents
from politeproxy.observe.fanout import events_of, fan_out, hears
from politeproxy.observe.logs import AccessLog
from politeproxy.observe.metrics import Metrics
from politeproxy.observe.status import StatusEvents
from politeproxy.pacing.base import PacerEvents
from politeproxy.proxy.common.events import ProxyEvents

H = "data.commoncrawl.org"


class Heard(ProxyEvents):
    def __init__(self, tag: str, log: list[tuple[str, str, str]]) -> None:
        self.tag, self.log = tag, log

    def retried(self, host: str) -> None:
        self.log.append((self.tag, "retried", host))

    def rejected(self, host: str, reason: str) -> None:
        self.log.append((self.tag, "rejected", reason))


class RetriesOnly(ProxyEvents):
    def __init__(self, log: list[tuple[str, str, str]]) -> None:
        self.log = log

    def retried(self, host: str) -> None:
        self.log.append(("c", "retried", host))


def test_every_sink_that_hears_an_event_gets_it_in_order() -> None:
    log: list[tuple[str, str, str]] = []
    joined = fan_out(ProxyEvents, Heard("a", log), RetriesOnly(log), Heard("b", log))
    joined.retried(H)
    joined.rejected(H, "max_wait")
    joined.tunnels_changed(3)  # nobody hears it: the family's no-op
    assert log == [
        ("a", "retried", H), ("c", "retried", H), ("b", "retried", H),
        ("a", "rejected", "max_wait"), ("b", "rejected", "max_wait"),
    ]  # fmt: skip


def test_one_sink_left_is_bound_directly() -> None:
    m, access = Metrics(), AccessLog()
    joined = fan_out(ProxyEvents, m, access)
    assert joined.answered == m.answered  # AccessLog does not count: metrics alone, no call between
    assert joined.access == access.access  # Metrics keeps the family's no-op for the access line
    assert joined.bytes_relayed == m.bytes_relayed


def test_an_inherited_no_op_of_another_family_is_not_heard() -> None:
    """StatusEvents inherits ``rejected`` from PacerEvents, not ProxyEvents: it still hears nothing there,
    so metrics counts a refusal once."""
    assert not hears(StatusEvents(), "rejected")
    assert not hears(Metrics(), "access")
    m = Metrics()
    ev = StatusEvents(m)
    assert ev.rejected == m.rejected
    ev.rejected(H, "max_wait", "etl")
    line = 'politeproxy_rejected_total{host="data.commoncrawl.org",pipeline="etl",reason="max_wait"} 1.0'
    assert line in m.render().decode()


def test_a_new_event_needs_only_its_declaration() -> None:
    class More(CacheEvents):
        def pinged(self, n: int) -> None:
            """An event declared on a family (here a test's own), nowhere else."""

    got: list[int] = []

    class Sink(More):
        def pinged(self, n: int) -> None:
            got.append(n)

    assert "pinged" in events_of(More)
    joined = fan_out(More, More(), Sink(), Sink())
    joined.pinged(7)
    assert got == [7, 7]


def test_every_family_event_is_a_method_with_a_docstring() -> None:
    for family in (ProxyEvents, PacerEvents, CacheEvents):
        for name in events_of(family):
            assert getattr(family, name).__doc__, (family.__name__, name)
