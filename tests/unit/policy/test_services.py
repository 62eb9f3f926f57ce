"""The service map (issue 24): what Common Crawl counts as one service, whatever name a tool uses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.hosts import valid_hostname
from politeproxy.policy.services import NAMED, SERVICE_HOST, service_key, service_of

ROWS = [
    ("data.commoncrawl.org", "/crawl-data/x.warc.gz", "data"),
    ("DATA.commoncrawl.org.", "/", "data"),
    ("index.commoncrawl.org", "/cc-index/table/cc-main/x.parquet", "index"),
    ("commoncrawl.org", "/", "www"),
    ("www.commoncrawl.org", "/", "www"),
    ("commoncrawl.s3.amazonaws.com", "/cc-index/table/x", "bucket"),
    ("commoncrawl.s3.us-east-1.amazonaws.com", "/x", "bucket"),
    ("commoncrawl.s3.mx-central-1.amazonaws.com", "/x", "bucket"),  # a region shape, listed or not
    ("commoncrawl.s3.dualstack.us-east-1.amazonaws.com", "/x", "bucket"),
    ("commoncrawl.s3-fips.us-east-1.amazonaws.com", "/x", "bucket"),
    ("commoncrawl.s3-fips.dualstack.us-gov-west-1.amazonaws.com", "/x", "bucket"),
    ("commoncrawl.s3-us-west-2.amazonaws.com", "/x", "bucket"),
    ("commoncrawl.s3-external-1.amazonaws.com", "/x", "bucket"),
    ("s3.amazonaws.com", "/commoncrawl/crawl-data/x", "bucket"),
    ("s3.us-east-1.amazonaws.com", "/commoncrawl/x", "bucket"),
    ("s3.dualstack.us-east-1.amazonaws.com", "/commoncrawl/x", "bucket"),
    ("s3.amazonaws.com", "/x/../commoncrawl/y", "bucket"),  # the path S3 resolves
    ("s3.amazonaws.com", "/otherbucket/x", "s3.amazonaws.com"),  # another bucket: not Common Crawl's
    ("s3.amazonaws.com", None, "bucket"),  # paced already: on S3's endpoints only the bucket is
    ("otherbucket.s3.amazonaws.com", "/x", "otherbucket.s3.amazonaws.com"),
    ("commoncrawl.s3.evil.amazonaws.com", "/x", "commoncrawl.s3.evil.amazonaws.com"),  # no region shape
    ("foo.commoncrawl.org", "/", "other-cc"),  # every unknown name under commoncrawl.org: one service
    ("h1x.commoncrawl.org", "/", "other-cc"),
    ("a.b.commoncrawl.org.", "/", "other-cc"),
    ("other.commoncrawl.org", "/", "other-cc"),
    ("xcommoncrawl.org", "/", "xcommoncrawl.org"),  # not under the domain
    ("example.org", "/", "example.org"),
    ("../x.commoncrawl.org", "/", "other"),
    ("", "/", "other"),
    ("a b.org", "/", "other"),
]


@pytest.mark.parametrize(("host", "path", "service"), ROWS)
def test_service_of(host: str, path: str | None, service: str) -> None:
    assert service_of(host, path) == service


def test_named_services_have_one_host_each() -> None:
    """The key a per-service limit is kept under: the bucket's is its virtual-hosted name."""
    assert service_key("commoncrawl.s3.dualstack.eu-west-1.amazonaws.com") == "commoncrawl.s3.amazonaws.com"
    assert service_key("s3.us-west-2.amazonaws.com") == "commoncrawl.s3.amazonaws.com"
    assert service_key("data.commoncrawl.org") == "data.commoncrawl.org"
    assert service_key("example.org") == "example.org"
    for name, host in SERVICE_HOST.items():
        assert service_of(host) == name
        assert service_key(host) == host  # a key is its own key: the places table may map twice


@given(st.text(max_size=300), st.one_of(st.none(), st.text(max_size=300)))
def test_never_raises_and_bounded(host: str, path: str | None) -> None:
    """Any input: one of the named services, or a valid host name (at most 253 characters)."""
    s = service_of(host, path)
    assert s in NAMED or (valid_hostname(s) and len(s) <= 253)
    k = service_key(host)
    assert k == service_key(k)
    assert k in NAMED or valid_hostname(k)


@given(st.from_regex(r"[a-z]{2}-[a-z]{4,9}-[1-9]", fullmatch=True))
def test_every_region_name_of_the_bucket_is_the_bucket(region: str) -> None:
    for host in (
        f"commoncrawl.s3.{region}.amazonaws.com",
        f"commoncrawl.s3.dualstack.{region}.amazonaws.com",
        f"commoncrawl.s3-{region}.amazonaws.com",
    ):
        assert service_of(host, "/x") == "bucket"
    assert service_of(f"s3.{region}.amazonaws.com", "/commoncrawl/x") == "bucket"


CLASSIFY_ROWS = [
    ("data.commoncrawl.org", "/cc-index/table/cc-main/warc/x.parquet", "exempt"),
    ("data.commoncrawl.org", "/projects/host-index-testing/v2/x.parquet", "exempt"),
    ("data.commoncrawl.org", "/projects/host-index/v3/x.parquet", "exempt"),  # a successor
    ("commoncrawl.s3.amazonaws.com", "/cc-index/table/x", "exempt"),
    ("commoncrawl.s3.dualstack.us-east-1.amazonaws.com", "/projects/host-index-testing/v2/x", "exempt"),
    ("s3.us-east-1.amazonaws.com", "/commoncrawl/cc-index/table/x", "exempt"),
    ("index.commoncrawl.org", "/cc-index/table/x", "paced"),  # the index server keeps its interval
    ("commoncrawl.org", "/cc-index/table/x", "paced"),
    ("data.commoncrawl.org", "/crawl-data/x.warc.gz", "paced"),
    ("data.commoncrawl.org", "/projects/other/x", "paced"),
]


@pytest.mark.parametrize(("host", "path", "klass"), CLASSIFY_ROWS)
def test_default_exempt_rule_per_service(host: str, path: str, klass: str) -> None:
    from politeproxy.policy.classify import Classifier
    from politeproxy.policy.hosts import DEFAULT_PACED_HOSTS, S3_PATH_STYLE_HOSTS, HostSet

    c = Classifier(HostSet(DEFAULT_PACED_HOSTS + S3_PATH_STYLE_HOSTS))
    assert c.classify("GET", host, path, True) == klass
    assert c.classify("GET", host, path, False) == "paced"  # no Range: a whole-object GET is paced


def test_default_cache_rules_cover_the_host_index_on_every_bucket_name() -> None:
    from politeproxy.policy.cacherules import default_rules

    data = default_rules()[0]
    assert data.matches(
        "commoncrawl.s3.dualstack.us-east-1.amazonaws.com", "/projects/host-index-testing/v2/x"
    )
    assert data.matches("data.commoncrawl.org", "/cc-index/table/x")
    assert not data.matches("index.commoncrawl.org", "/cc-index/table/x")
