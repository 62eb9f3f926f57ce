"""The access line's new fields (issue 13): path (redacted, scrubbed, bounded), pipeline, retries, in the
plain and the JSON form; the passage headers' helpers; the JSON error line of a refusal to start."""

from __future__ import annotations

import json
import logging
import math

from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from politeproxy.observe.logs import PLAIN_FORMAT, JsonFormatter, error_line
from politeproxy.policy.backoff import Delay
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.events import PATH_LIMIT, access_path
from politeproxy.proxy.common.exchange import Exchange
from politeproxy.proxy.common.passage import (
    MAX_VIA,
    PIPELINE_HEADER,
    VIA_ENTRY,
    WAIT_HEADER,
    add_via,
    stamp,
    wait_text,
)
from politeproxy.proxy.forwarding.eventlog import OperatorLog
from politeproxy.proxy.origin.upstream import PoolFull
from tests.support.access_lines import render

REC = Exchange(
    "10.0.0.1", "GET", "data.commoncrawl.org", "/crawl-data/x.warc.gz", Klass.PACED, "etl", 0.41234, 200, 42,
    0.5, retries=1,
)  # fmt: skip


def test_plain_line_has_path_pipeline_and_retries() -> None:
    line = render(logging.Formatter(PLAIN_FORMAT), REC)
    assert line.endswith(
        "10.0.0.1 GET data.commoncrawl.org/crawl-data/x.warc.gz paced wait=0.412s status=200 bytes=42"
        " duration=0.500s retries=1 pipeline=etl"
    ), line


def test_json_line_has_path_pipeline_and_retries() -> None:
    obj = json.loads(render(JsonFormatter(), REC))
    assert obj["path"] == "/crawl-data/x.warc.gz"
    assert (obj["pipeline"], obj["retries"], obj["class"], obj["wait"]) == ("etl", 1, "paced", 0.4123)


def test_the_cache_result_is_on_the_line_in_both_forms() -> None:
    rec = Exchange(
        "10.0.0.1", "GET", "data.commoncrawl.org", "/", Klass.PACED, "etl", 0.0, 200, 42, 0.01, cache="hit"
    )
    assert render(logging.Formatter(PLAIN_FORMAT), rec).endswith(" cache=hit")
    assert json.loads(render(JsonFormatter(), rec))["cache"] == "hit"
    assert "cache" not in json.loads(render(JsonFormatter(), REC))  # not a cacheable request: no key


def test_access_path_keeps_the_path_and_never_the_query() -> None:
    raw = (
        "/crawl-data/a.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAXXXX%2F2024&"
        "X-Amz-Signature=deadbeef&X-Amz-Security-Token=tok&Key-Pair-Id=K1&sig2=s3cr3t&url=example.com"
    )
    out = access_path(raw, limit=1000)
    assert out == "/crawl-data/a.gz?..."
    assert access_path("/crawl-data/a.gz") == "/crawl-data/a.gz"


@given(st.text(max_size=200), st.text(max_size=200))
def test_access_path_never_shows_any_of_the_query(path: str, query: str) -> None:
    """Whatever the query holds (a signature under any name), none of it reaches the line."""
    out = access_path(path.replace("?", "") + "?" + query, limit=10_000)
    assert out.endswith("?...")


def test_access_path_is_cut_and_scrubbed() -> None:
    assert access_path("/a\r\nb c\x1b[31m") == "/a%0D%0Ab%20c%1B[31m"
    long = access_path("/" + "x" * 500)
    assert len(long) == PATH_LIMIT and long.endswith("...")


@given(st.text(max_size=3000))
def test_access_path_never_raises_and_is_printable_and_bounded(raw: str) -> None:
    """Any text (lone surrogates included): printable ASCII only, no space, at most PATH_LIMIT chars."""
    out = access_path(raw)
    assert len(out) <= PATH_LIMIT
    assert all(0x21 <= ord(c) <= 0x7E for c in out), out


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_wait_text_is_always_a_finite_non_negative_number(seconds: float) -> None:
    """The wait header never says nan, inf or a negative time."""
    value = float(wait_text(seconds))
    assert math.isfinite(value) and value >= 0


def test_via_appends_after_the_upstream_entries() -> None:
    h: CIMultiDict[str] = CIMultiDict([("Via", "1.1 a.cloudfront.net (CloudFront)"), ("Via", "1.0 b")])
    add_via(h)
    assert h.getall("Via") == [f"1.1 a.cloudfront.net (CloudFront), 1.0 b, {VIA_ENTRY}"]
    fresh: CIMultiDict[str] = CIMultiDict()
    stamp(fresh, 0.5, "etl")
    assert (fresh["Via"], fresh[WAIT_HEADER], fresh[PIPELINE_HEADER]) == (VIA_ENTRY, "0.500", "etl")


def test_error_line_is_json_in_json_mode() -> None:
    obj = json.loads(error_line("cannot listen on 127.0.0.1:1: in use", "json"))
    assert (obj["level"], obj["message"]) == ("error", "cannot listen on 127.0.0.1:1: in use")
    assert error_line("x", "plain") == "politeproxy: error: x"


def _oplog() -> tuple[OperatorLog, list[tuple[str, str]], list[float]]:
    now = [0.0]
    lines: list[tuple[str, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((record.levelname, record.getMessage()))

    logger = logging.getLogger(f"politeproxy.events.test{id(lines)}")
    logger.handlers[:] = [Capture()]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return OperatorLog(logger, clock=lambda: now[0]), lines, now


def test_operator_lines_for_backoff_block_and_probe() -> None:
    op, lines, _now = _oplog()
    op.answered("index.commoncrawl.org", 503, Delay(2.0), probe=False)
    op.answered("data.commoncrawl.org", 403, Delay(120.0, block=True), probe=False)
    op.probe("data.commoncrawl.org", "GET", "/crawl-data/x")
    op.answered("data.commoncrawl.org", 200, None, probe=True)
    op.answered("data.commoncrawl.org", 200, None, probe=False)  # the usual success: no line
    assert [m for _lvl, m in lines] == [
        "index.commoncrawl.org: 503 from upstream: backing off 2.0s",
        "data.commoncrawl.org: 403 from upstream: blocked for 120.0s, then one probe request",
        "data.commoncrawl.org: sending the probe after a block: GET /crawl-data/x",
        "data.commoncrawl.org: the probe after a block got 200; the host is paced again",
    ]
    # a block stops every pipeline: WARNING (issue 41); the rest are INFO
    assert [lvl for lvl, _m in lines] == ["INFO", "WARNING", "INFO", "INFO"]


def test_refusals_of_one_cause_make_one_line_per_interval() -> None:
    """A client retrying a refusal at once (issue 41): one line per cause and pipeline per 30 s, then the
    count of the rest; another cause or pipeline has its own line."""
    op, lines, now = _oplog()
    for i in range(500):
        now[0] = i * 0.1  # 50 s of a tight loop
        op.refused("etl", 503, f"would wait {i}s", "max_wait")
    op.refused("etl", 503, "queue", "queue_full")
    op.refused("other", 503, "would wait", "max_wait")
    texts = [m for _lvl, m in lines]
    assert texts == [
        "etl: refused 503: would wait 0s",
        "etl 503 max_wait: 299 more refusals not logged (rate-limited)",
        "etl: refused 503: would wait 300s",
        "etl: refused 503: queue",
        "other: refused 503: would wait",
    ]


def test_operator_lines_are_rate_limited_and_bounded() -> None:
    op, lines, now = _oplog()
    for _ in range(50):
        op.answered("index.commoncrawl.org", 503, Delay(1.0), probe=False)
        op.refused("10.0.0.1", 503, "would wait")
    assert len(lines) == 10  # 5 per key per window
    now[0] = 11.0
    op.refused("10.0.0.1", 421, "misdirected")
    assert lines[-2:] == [
        ("INFO", "10.0.0.1: 45 more refusals not logged (rate-limited)"),
        ("INFO", "10.0.0.1: refused 421: misdirected"),
    ]
    for i in range(100):
        op.pool_full(PoolFull(f"pool{i}", 4))
    assert len(op._pool_full) <= 16
    before = len(lines)
    for _ in range(5):
        op.pool_full(PoolFull("paced", 4))  # within 10 s of its first line: held back and counted
    assert len(lines) == before + 1
    now[0] = 30.0
    op.pool_full(PoolFull("paced", 4))
    assert lines[-1][1].endswith("(4 more since the last line)")


@given(
    st.lists(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=3000), max_size=5)
)
def test_add_via_never_raises_and_stays_bounded(upstream_vias: list[str]) -> None:
    """Any upstream Via field lines: one line comes out, ours last, at most MAX_VIA plus our entry."""
    h: CIMultiDict[str] = CIMultiDict([("Via", v) for v in upstream_vias])
    add_via(h)
    (value,) = h.getall("Via")
    assert value.endswith(VIA_ENTRY) and len(value) <= MAX_VIA + len(VIA_ENTRY) + 2
