"""Policy core, driven with an injected clock: no sockets, no sleeps."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from politeproxy.policy.backoff import (
    DEFAULT_THROTTLE_CODES,
    BackoffPolicy,
    apply_success,
    apply_throttle,
    parse_retry_after,
    retry_after_seconds,
    throttle_delay,
)
from politeproxy.policy.classify import DEFAULT_EXEMPT_RULES, Classifier, ExemptRule, Klass
from politeproxy.policy.hosts import HostSet, host_matches
from politeproxy.policy.robots import crawl_delay, effective_crawl_delay
from politeproxy.policy.slots import HostState, Outcome, claim

NOW = 1_700_000_000.0


# -- Retry-After ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2", 2.0),
        ("0", 0.0),
        (" 120 ", 120.0),
        ("-5", 0.0),  # negative clamped to 0
        ("", None),
        ("   ", None),
        (None, None),
        ("soon", None),
        ("1.5", None),  # delta-seconds is a whole number; anything else is not Retry-After
        ("2s", None),
        ("Mon, 99 Foo 2024 99:99:99 GMT", None),
    ],
)
def test_retry_after_delta_and_invalid(value: str | None, want: float | None) -> None:
    assert parse_retry_after(value, NOW) == want


def test_retry_after_http_date() -> None:
    when = datetime.fromtimestamp(NOW + 90, UTC)
    assert parse_retry_after(format_datetime(when, usegmt=True), NOW) == pytest.approx(90.0)
    # The RFC 850 and asctime forms HTTP also allows.
    assert parse_retry_after(when.strftime("%A, %d-%b-%y %H:%M:%S GMT"), NOW) == pytest.approx(90.0)
    assert parse_retry_after(when.strftime("%a %b %d %H:%M:%S %Y"), NOW) == pytest.approx(90.0)
    # A date in the past means "now": clamped, never negative.
    past = datetime.fromtimestamp(NOW - 3600, UTC)
    assert parse_retry_after(format_datetime(past, usegmt=True), NOW) == 0.0


# -- backoff ----------------------------------------------------------------------------------------


def test_backoff_growth_without_jitter() -> None:
    p = BackoffPolicy(base=1.0, factor=2.0, cap=300.0, jitter=0.0)
    got = [throttle_delay(n, None, p, rand=0.999).seconds for n in range(10)]
    assert got == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


@pytest.mark.parametrize("n", [0, 1, 3, 6])
def test_backoff_jitter_bounds(n: int) -> None:
    p = BackoffPolicy(base=1.0, factor=2.0, cap=300.0, jitter=0.2)
    raw = 2.0**n
    lo = throttle_delay(n, None, p, rand=0.0).seconds
    hi = throttle_delay(n, None, p, rand=0.999999).seconds
    assert lo == raw
    assert raw < hi <= raw * 1.2
    for r in (0.1, 0.5, 0.9):
        assert lo <= throttle_delay(n, None, p, rand=r).seconds <= hi


def test_backoff_cap_holds_with_jitter_and_huge_counts() -> None:
    p = BackoffPolicy(base=1.0, cap=300.0, jitter=0.5)
    for n in (8, 9, 50, 10_000):
        d = throttle_delay(n, None, p, rand=0.999)
        assert d.seconds == 300.0
        assert d.capped_from is None


def test_retry_after_wins_over_backoff_and_cap_is_reported() -> None:
    p = BackoffPolicy(base=1.0, cap=300.0, jitter=0.2)
    assert throttle_delay(5, 2.0, p, rand=0.9).seconds == 2.0  # no jitter, no growth on Retry-After
    assert throttle_delay(0, 0.0, p, rand=0.9).seconds == 0.0
    d = throttle_delay(0, 3600.0, p, rand=0.0)
    assert d.seconds == 300.0
    assert d.capped_from == 3600.0


def test_throttle_then_success_resets_the_count() -> None:
    p = BackoffPolicy(base=1.0, cap=300.0, jitter=0.0)
    st = HostState()
    delays = []
    now = NOW
    for _ in range(4):
        d = throttle_delay(st.throttles, None, p, rand=0.0)
        st = apply_throttle(st, now, d.seconds)
        delays.append(d.seconds)
        assert st.backoff_until == now + d.seconds
        now += d.seconds
    assert delays == [1, 2, 4, 8]
    assert st.throttles == 4
    st = apply_success(st)
    assert st.throttles == 0
    assert throttle_delay(st.throttles, None, p, rand=0.0).seconds == 1.0


def test_a_shorter_retry_after_never_shortens_an_active_backoff() -> None:
    st = apply_throttle(HostState(), NOW, 30.0)
    st = apply_throttle(st, NOW + 1, 2.0)
    assert st.backoff_until == NOW + 30.0
    assert st.throttles == 2


def test_default_throttle_codes_and_retry_after_header_value() -> None:
    assert {429, 503, 500} <= DEFAULT_THROTTLE_CODES and 403 not in DEFAULT_THROTTLE_CODES  # 403: a block
    assert not {200, 206, 404, 416} & DEFAULT_THROTTLE_CODES
    assert retry_after_seconds(0.0) == 1
    assert retry_after_seconds(0.2) == 1
    assert retry_after_seconds(2.0) == 2
    assert retry_after_seconds(2.01) == 3


# -- robots.txt Crawl-delay -------------------------------------------------------------------------


def test_crawl_delay_parse() -> None:
    assert crawl_delay("User-agent: *\nCrawl-delay: 2.5\n") == 2.5
    assert crawl_delay("User-agent: *\nDisallow: /x\n") is None
    assert crawl_delay("") is None
    text = "User-agent: Googlebot\nCrawl-delay: 9\n\nUser-agent: PolitePROXY\nCrawl-delay: 0.5\n\n"
    text += "User-agent: *\nCrawl-delay: 4\n"
    assert crawl_delay(text) == 0.5  # our own group wins over *
    assert crawl_delay(text, agent="someone-else") == 4.0
    # Several agents in one group, comments, odd spacing and case.
    assert crawl_delay("user-agent: a\nUSER-AGENT: *   # all\n  crawl-delay :  3 # slow\n") == 3.0
    # Invalid and negative values are ignored.
    assert crawl_delay("User-agent: *\nCrawl-delay: soon\n") is None
    assert crawl_delay("User-agent: *\nCrawl-delay: -1\n") is None
    # A delay in another agent's group does not apply to us.
    assert crawl_delay("User-agent: other\nCrawl-delay: 7\n") is None
    # A Crawl-delay before any User-agent line belongs to no group.
    assert crawl_delay("Crawl-delay: 7\n") is None


def test_crawl_delay_empty_agent_line_matches_nobody() -> None:
    assert crawl_delay("User-agent:\nCrawl-delay: 7\n") is None


def test_crawl_delay_cap() -> None:
    assert effective_crawl_delay(None, 10.0) == 0.0
    assert effective_crawl_delay(3.0, 10.0) == 3.0
    assert effective_crawl_delay(3600.0, 10.0) == 10.0


# -- the claim --------------------------------------------------------------------------------------


def test_claim_slot_arithmetic_no_burst() -> None:
    gap = 0.2
    nxt = 0.0
    host = HostState()
    slots = []
    for _ in range(5):
        c, nxt, host = claim(NOW, nxt, gap, host, interval=0.0)
        assert c.granted
        slots.append(c.at)
    # Five claims at the same instant: one slot each, gap apart, the first at once.
    assert slots == pytest.approx([NOW + i * gap for i in range(5)])
    assert nxt == pytest.approx(NOW + 5 * gap)
    # After idle, the first grant is at once and the next is a full gap later: no burst.
    later = NOW + 100
    c, nxt, host = claim(later, nxt, gap, host, 0.0)
    assert c.at == later and c.wait == 0.0
    c, nxt, host = claim(later, nxt, gap, host, 0.0)
    assert c.wait == pytest.approx(gap)


def test_claim_gap_zero_is_off_but_host_interval_holds() -> None:
    c, nxt, host = claim(NOW, 123.0, 0.0, HostState(), interval=1.0)
    assert c.granted and c.wait == 0.0 and nxt == 123.0
    assert host.next_allowed == NOW + 1.0
    c2, nxt2, host2 = claim(NOW + 0.5, nxt, 0.0, host, interval=1.0)
    assert c2.outcome is Outcome.HOST_NOT_READY
    assert c2.wait == pytest.approx(0.5)
    assert (nxt2, host2) == (nxt, host)


def test_claim_not_ready_reserves_nothing() -> None:
    gap = 0.2
    busy = HostState(backoff_until=NOW + 2.0, throttles=1)
    c, nxt, host = claim(NOW, NOW + 0.4, gap, busy, interval=0.0)
    assert c.outcome is Outcome.HOST_NOT_READY
    assert not c.granted
    assert c.wait == pytest.approx(2.0) and c.at == NOW + 2.0
    assert nxt == NOW + 0.4  # the global slot was not taken
    assert host is busy  # nor the host's next time
    # Another host claims the very slot the first one could not use: backoff never holds the schedule.
    c2, nxt2, _ = claim(NOW, nxt, gap, HostState(), 0.0)
    assert c2.granted and c2.at == NOW + 0.4 and nxt2 == pytest.approx(NOW + 0.6)


def test_claim_host_ready_by_the_global_slot_is_granted() -> None:
    # The host is ready at +0.3, the global slot is +0.5: ready by then, so one claim takes both.
    st = HostState(next_allowed=NOW + 0.3)
    c, nxt, host = claim(NOW, NOW + 0.5, 0.2, st, interval=1.0)
    assert c.granted and c.at == NOW + 0.5
    assert nxt == pytest.approx(NOW + 0.7)
    assert host.next_allowed == pytest.approx(NOW + 1.5)


def test_claim_interval_and_crawl_delay_take_the_larger() -> None:
    st = HostState(crawl_delay=3.0)
    c, _, host = claim(NOW, 0.0, 0.2, st, interval=1.0)
    assert c.granted and host.next_allowed == NOW + 3.0
    st = HostState(crawl_delay=0.5)
    _, _, host = claim(NOW, 0.0, 0.2, st, interval=1.0)
    assert host.next_allowed == NOW + 1.0


def test_claim_max_wait_answer_too_late() -> None:
    gap = 0.2
    # The global schedule is 10 s out; a 5 s deadline makes the claim reserve nothing.
    c, nxt, host = claim(NOW, NOW + 10.0, gap, HostState(), 0.0, deadline=NOW + 5.0)
    assert c.outcome is Outcome.TOO_LATE
    assert c.wait == pytest.approx(10.0) and c.at == NOW + 10.0
    assert nxt == NOW + 10.0 and host == HostState()
    # The host's backoff beyond the deadline: too late, and the wait says until when.
    busy = HostState(backoff_until=NOW + 60.0)
    c, nxt, host = claim(NOW, 0.0, gap, busy, 0.0, deadline=NOW + 25.0)
    assert c.outcome is Outcome.TOO_LATE and c.wait == pytest.approx(60.0)
    assert nxt == 0.0 and host is busy
    # Within the deadline: granted.
    c, _, _ = claim(NOW, NOW + 4.0, gap, HostState(), 0.0, deadline=NOW + 5.0)
    assert c.granted and c.wait == pytest.approx(4.0)
    # Exactly at the deadline still goes.
    c, _, _ = claim(NOW, NOW + 5.0, gap, HostState(), 0.0, deadline=NOW + 5.0)
    assert c.granted


# -- classification ---------------------------------------------------------------------------------


@pytest.fixture
def classifier() -> Classifier:
    return Classifier(HostSet())


@pytest.mark.parametrize(
    ("method", "host", "path", "has_range", "want"),
    [
        ("GET", "data.commoncrawl.org", "/cc-index/table/cc-main/warc/part-0.parquet", True, Klass.EXEMPT),
        ("HEAD", "data.commoncrawl.org", "/cc-index/table/x.parquet", True, Klass.EXEMPT),
        ("get", "DATA.CommonCrawl.org.", "/cc-index/table/x.parquet?x=1", True, Klass.EXEMPT),
        ("GET", "commoncrawl.s3.amazonaws.com", "/cc-index/table/x.parquet", True, Klass.EXEMPT),
        ("GET", "commoncrawl.s3.us-east-1.amazonaws.com", "/cc-index/table/x", True, Klass.EXEMPT),
        # Without Range, or another method, or another path: paced.
        ("GET", "data.commoncrawl.org", "/cc-index/table/x.parquet", False, Klass.PACED),
        ("POST", "data.commoncrawl.org", "/cc-index/table/x.parquet", True, Klass.PACED),
        ("GET", "data.commoncrawl.org", "/crawl-data/CC-MAIN-2024-10/warc.paths.gz", True, Klass.PACED),
        ("GET", "data.commoncrawl.org", "/cc-index/collections/index.html", True, Klass.PACED),
        ("GET", "index.commoncrawl.org", "/CC-MAIN-2024-10-index?url=x", False, Klass.PACED),
        ("GET", "commoncrawl.org", "/", False, Klass.PACED),
        # Dot segments cannot smuggle a paced path under the exempt prefix.
        ("GET", "data.commoncrawl.org", "/cc-index/table/../../crawl-data/x.warc.gz", True, Klass.PACED),
        ("GET", "data.commoncrawl.org", "/cc-index/table/%2e%2e/%2E%2E/crawl-data/x", True, Klass.PACED),
        ("GET", "data.commoncrawl.org", "/cc-index/table/..%2f..%2fcrawl-data/x", True, Klass.PACED),
        ("GET", "data.commoncrawl.org", "/cc-index/table/./x.parquet", True, Klass.EXEMPT),
        # Lookalike hosts are not Common Crawl hosts at all: never paced, never exempt.
        ("GET", "commoncrawl.org.evil.example", "/cc-index/table/x", True, Klass.PASSTHROUGH),
        ("GET", "notcommoncrawl.org", "/", False, Klass.PASSTHROUGH),
        ("GET", "data.notcommoncrawl.org", "/", False, Klass.PASSTHROUGH),
        ("GET", "commoncrawl.s3.amazonaws.com.evil.example", "/", False, Klass.PASSTHROUGH),
        ("GET", "commoncrawl.s3.evil.amazonaws.com", "/", False, Klass.PASSTHROUGH),
        ("GET", "other.example", "/cc-index/table/x", True, Klass.PASSTHROUGH),
    ],
)
def test_classify_default_rules(
    classifier: Classifier, method: str, host: str, path: str, has_range: bool, want: Klass
) -> None:
    assert classifier.classify(method, host, path, has_range) is want


def test_exempt_size_probe_counts_as_a_range_read(classifier: Classifier) -> None:
    # duckdb and pyarrow open a parquet file with "Range: bytes=0-0" (or a HEAD) to learn its size.
    # The classifier sees only "has a Range header", so the probe is exempt like every other range read.
    assert (
        classifier.classify("GET", "data.commoncrawl.org", "/cc-index/table/a.parquet", True) is Klass.EXEMPT
    )
    assert (
        classifier.classify("HEAD", "data.commoncrawl.org", "/cc-index/table/a.parquet", True) is Klass.EXEMPT
    )


def test_exempt_rules_configurable_globs_and_range_optional() -> None:
    rules = (
        ExemptRule(host="data.commoncrawl.org", path="/cc-index/table/*/*.parquet", range_required=True),
        ExemptRule(host="*.commoncrawl.org", path="/public/*", range_required=False),
    )
    c = Classifier(HostSet(), rules)
    d = "data.commoncrawl.org"
    assert c.classify("GET", d, "/cc-index/table/cc-main/a.parquet", True) is Klass.EXEMPT
    assert c.classify("GET", d, "/cc-index/table/cc-main/a.json", True) is Klass.PACED
    assert c.classify("GET", d, "/cc-index/table/cc-main/a.parquet", False) is Klass.PACED
    assert c.classify("GET", d, "/public/readme.txt", False) is Klass.EXEMPT
    assert c.classify("GET", d, "/public/../crawl-data/x", False) is Klass.PACED
    # The rule's host pattern is honoured.
    assert c.classify("GET", "index.commoncrawl.org", "/cc-index/table/x/a.parquet", True) is Klass.PACED
    # No rules: everything on a paced host is paced.
    assert Classifier(HostSet(), ()).classify("GET", d, "/cc-index/table/x", True) is Klass.PACED
    assert len(DEFAULT_EXEMPT_RULES) >= 1


@pytest.mark.parametrize(
    ("host", "pattern", "want"),
    [
        ("data.commoncrawl.org", "*.commoncrawl.org", True),
        ("a.b.commoncrawl.org", "*.commoncrawl.org", True),
        ("commoncrawl.org", "*.commoncrawl.org", False),
        ("notcommoncrawl.org", "*.commoncrawl.org", False),
        ("commoncrawl.org.evil.example", "*.commoncrawl.org", False),
        ("commoncrawl.org.evil.example", "commoncrawl.org", False),
        ("xcommoncrawl.org", "commoncrawl.org", False),
        ("commoncrawl.s3.eu-west-1.amazonaws.com", "commoncrawl.s3.*.amazonaws.com", True),
        ("commoncrawl.s3.evil.amazonaws.com", "commoncrawl.s3.*.amazonaws.com", False),
        ("commoncrawl.s3.x.y.amazonaws.com", "commoncrawl.s3.*.amazonaws.com", False),
    ],
)
def test_host_patterns(host: str, pattern: str, want: bool) -> None:
    assert host_matches(host, pattern) is want
