"""policy.forms: the request forms Common Crawl's services refuse by themselves, answered locally (issue 42,
item 1), as a table; and the decision never raises, whatever the method."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.forms import cloudfront_refuses, refused_form

DATA, INDEX, WWW = "data.commoncrawl.org", "index.commoncrawl.org", "commoncrawl.org"
BUCKET, REGIONAL, PATH_STYLE = (
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.us-east-1.amazonaws.com",
    "s3.amazonaws.com",
)

# (host, path, method, has body) -> (status, Allow) of the local answer, or None: the request goes
CASES: list[tuple[str, str, str, bool, tuple[int, str] | None]] = [
    (DATA, "/crawl-data/x", "GET", False, None),
    (DATA, "/crawl-data/x", "HEAD", False, None),
    (DATA, "/crawl-data/x", "DELETE", False, (405, "GET, HEAD")),
    (DATA, "/crawl-data/x", "POST", True, (405, "GET, HEAD")),
    (DATA, "/crawl-data/x", "PUT", True, (405, "GET, HEAD")),
    (DATA, "/crawl-data/x", "OPTIONS", False, (405, "GET, HEAD")),
    (DATA, "/crawl-data/x", "PATCH", False, (405, "GET, HEAD")),
    (DATA, "/crawl-data/x", "get", False, (405, "GET, HEAD")),  # methods are case-sensitive
    (DATA, "/crawl-data/x", "GET", True, (400, "")),
    (DATA, "/crawl-data/x", "HEAD", True, (400, "")),
    (INDEX, "/CC-MAIN-2024-10-index?url=x", "POST", False, (405, "GET, HEAD")),
    (INDEX, "/CC-MAIN-2024-10-index?url=x", "GET", True, (400, "")),
    ("DATA.commoncrawl.org.", "/x", "TRACE", False, (405, "GET, HEAD")),  # the same service, any spelling
    (BUCKET, "/crawl-data/x", "GET", False, None),
    (BUCKET, "/crawl-data/x", "HEAD", False, None),
    (BUCKET, "/crawl-data/x", "OPTIONS", False, None),  # a CORS preflight: S3 answers it
    (BUCKET, "/crawl-data/x?select&select-type=2", "POST", True, None),  # S3 Select: a read
    (BUCKET, "/crawl-data/x", "GET", True, None),  # S3 takes it (no CloudFront in front)
    (BUCKET, "/crawl-data/x", "PUT", True, (403, "")),
    (REGIONAL, "/crawl-data/x", "DELETE", False, (403, "")),
    (PATH_STYLE, "/commoncrawl/crawl-data/x", "PUT", True, (403, "")),
    (PATH_STYLE, "/other-bucket/x", "PUT", True, None),  # another bucket: not Common Crawl's
    (BUCKET, "/x", "BREW", False, (405, "GET, HEAD, OPTIONS, POST")),
    (WWW, "/", "POST", True, None),  # the web site's rules are not known here: passed on
    ("other.example", "/", "DELETE", False, None),
]


@pytest.mark.parametrize(
    ("host", "path", "method", "body", "want"), CASES, ids=[f"{c[2]}-{c[0]}{c[1][:12]}-{c[3]}" for c in CASES]
)
def test_each_form_is_passed_or_answered_locally(
    host: str, path: str, method: str, body: bool, want: tuple[int, str] | None
) -> None:
    r = refused_form(host, path, method, body)
    if want is None:
        assert r is None
        return
    assert r is not None
    assert (r.status, r.allow) == want
    assert r.headers == ({"Allow": want[1]} if want[1] else {})
    assert r.message


def test_cloudfront_refuses_any_method_but_get_and_head_and_any_body() -> None:
    assert not cloudfront_refuses("GET", False) and not cloudfront_refuses("HEAD", False)
    assert cloudfront_refuses("GET", True) and cloudfront_refuses("POST", False)
    assert cloudfront_refuses("OPTIONS", False) and cloudfront_refuses("get", False)


@given(st.text(max_size=80), st.text(max_size=80), st.text(max_size=40), st.booleans())
def test_never_raises_and_its_message_is_printable(host: str, path: str, method: str, body: bool) -> None:
    r = refused_form(host, path, method, body)
    assert r is None or (r.status in (400, 403, 405) and r.message.isprintable())
