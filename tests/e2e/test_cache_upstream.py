"""Answers the cache must never keep, from an upstream that misbehaves on purpose (a short 206, a body
cut mid-stream): the raw TLS upstream of tests.support.cache_upstream (the kill -9 test stalls a body on it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cache_upstream import S3, RawUpstream, body_for, fetch, raw_fixture, start_cache_proxy
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Certs, start_upstream

raw = raw_fixture()  # one raw upstream for the module


@pytest.fixture(scope="module")
def rp(tmp_path_factory: pytest.TempPathFactory, certs: Certs, raw: RawUpstream) -> Iterator[ProxyProc]:
    tmp = tmp_path_factory.mktemp("cache-raw")
    up = start_upstream(certs, tmp)
    p = start_cache_proxy(tmp, certs, raw, up=up)
    yield p
    p.stop()
    up.stop()


def test_a_short_206_is_relayed_but_never_stored(rp: ProxyProc, raw: RawUpstream) -> None:
    for i in (1, 2):
        status, h, body = fetch(rp, S3, "/crawl-data/short206.warc.gz", {"Range": "bytes=0-9"})
        assert (status, body) == (206, b"01234")
        assert raw.count("/crawl-data/short206") == i  # the second went upstream again
    assert 'result="hit"' not in [x for x in rp.metrics().splitlines() if "cache_requests" in x].__str__()


def test_a_body_cut_mid_stream_is_never_stored(rp: ProxyProc, raw: RawUpstream) -> None:
    for i in (1, 2):
        status, _h, body = fetch(rp, S3, "/crawl-data/cut.warc.gz")
        assert status == 200 and body.startswith(b"<cut>")  # the client sees a cut, never a short body
        assert raw.count("/crawl-data/cut") == i


def test_a_good_answer_from_the_same_upstream_is_stored(rp: ProxyProc, raw: RawUpstream) -> None:
    """The control for the two above: the same upstream's complete answers are kept."""
    for _ in range(3):
        status, h, body = fetch(rp, S3, "/crawl-data/good.warc.gz")
        assert status == 200 and body == body_for("/crawl-data/good.warc.gz")
    assert raw.count("/crawl-data/good") == 1
    assert h["etag"] == '"e1"' and "politeproxy" in h["via"] and "age" in h
