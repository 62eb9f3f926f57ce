"""policy.signals: each answer read by its cause (issue 24, item 4), from a table; and the reading never
raises, whatever the headers and bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.signals import PEEK, Cause, Signal, read_signal, wants_body

S3_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message>"
)
WAF_HTML = (
    b"<!DOCTYPE HTML><HTML><HEAD><TITLE>ERROR: The request could not be satisfied</TITLE></HEAD>\n"
    b"<BODY><H1>403 ERROR</H1><H2>The request could not be satisfied.</H2>Request blocked."
)
XML = {"Content-Type": "application/xml"}

CASES: list[tuple[str, int | None, dict[str, str], bytes, Cause]] = [
    ("S3 itself", 403, {"Server": "AmazonS3", **XML}, S3_XML, Cause.S3_DENIED),
    ("S3 by its Server alone", 403, {"Server": "AmazonS3"}, b"", Cause.S3_DENIED),
    (
        "S3 through CloudFront",
        403,
        {"Server": "AmazonS3", "X-Cache": "Error from cloudfront", **XML},
        S3_XML,
        Cause.S3_DENIED,
    ),
    ("S3's XML without a Server", 403, XML, S3_XML, Cause.S3_DENIED),
    (
        "CloudFront's own",
        403,
        {"Server": "CloudFront", "Content-Type": "text/html"},
        WAF_HTML,
        Cause.CLOUDFRONT,
    ),
    ("CloudFront by its Server alone", 403, {"Server": "CloudFront"}, b"", Cause.CLOUDFRONT),
    ("the WAF page without a Server", 403, {"Content-Type": "text/html"}, WAF_HTML, Cause.CLOUDFRONT),
    ("X-Cache alone says nothing", 403, {"X-Cache": "Error from cloudfront"}, b"", Cause.UNKNOWN_403),
    ("a plain 403", 403, {}, b"forbidden", Cause.UNKNOWN_403),
    (
        "nginx's 403",
        403,
        {"Server": "nginx", "Content-Type": "text/html"},
        b"<html>403</html>",
        Cause.UNKNOWN_403,
    ),
    ("404 from S3", 404, {"Server": "AmazonS3", **XML}, b"", Cause.NOT_FOUND),
    ("404 from CloudFront", 404, {"Server": "CloudFront"}, b"", Cause.NOT_FOUND),
    ("503: the status decides", 503, {"Server": "AmazonS3"}, b"", Cause.STATUS),
    ("200", 200, {}, b"", Cause.STATUS),
    ("no answer", None, {}, b"", Cause.STATUS),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_answer_is_read_by_its_cause(
    status: int | None, headers: dict[str, str], body: bytes, cause: Cause
) -> None:
    assert read_signal(status, headers, body).cause is cause


def test_only_a_403_whose_server_does_not_say_wants_the_body() -> None:
    assert wants_body(403, {}) and wants_body(403, XML) and wants_body(403, {"Server": "CloudFront", **XML})
    assert not wants_body(403, {"Server": "AmazonS3"})
    assert not wants_body(403, {"Content-Type": "application/octet-stream"})
    assert not wants_body(404, XML) and not wants_body(200, {}) and not wants_body(None, {})


def test_only_a_block_or_a_status_records() -> None:
    assert Cause.CLOUDFRONT.records and Cause.UNKNOWN_403.records and Cause.STATUS.records
    assert not (Cause.S3_DENIED.records or Cause.NOT_FOUND.records or Cause.LOCAL.records)


def test_the_reason_names_who_sent_it() -> None:
    s = read_signal(403, {"Server": "CloudFront"}, b"")
    assert s.reason(403) == "403 from CloudFront (Server: CloudFront)"
    assert Signal(Cause.UNKNOWN_403).reason(403) == "403 from an unknown server"


def test_only_the_first_peek_bytes_are_read() -> None:
    late = b"x" * PEEK + b"<Error><Code>AccessDenied</Code>"
    assert read_signal(403, XML, late).cause is Cause.UNKNOWN_403


def test_a_server_header_is_bounded_and_printable() -> None:
    s = read_signal(403, {"Server": "CloudFront\x00\x1b" + "y" * 500}, b"")
    assert s.cause is Cause.CLOUDFRONT and len(s.server) <= 64 and s.server.isprintable()


headers_st = st.dictionaries(
    st.sampled_from(["Server", "server", "Content-Type", "X-Cache", "Retry-After", "X"])
    | st.text(max_size=20),
    st.text(max_size=200),
    max_size=6,
)


@given(
    st.one_of(st.none(), st.integers(-(2**40), 2**40), st.sampled_from([403, 404])),
    headers_st,
    st.binary(max_size=2 * PEEK),
)
def test_reading_never_raises(status: int | None, headers: dict[str, str], body: bytes) -> None:
    s = read_signal(status, headers, body)
    assert isinstance(s.cause, Cause) and len(s.server) <= 64
    assert isinstance(wants_body(status, headers), bool)
    assert s.reason(status)


INVALID_METHOD_HTML = (
    b"<HTML><HEAD><TITLE>ERROR: The request could not be satisfied</TITLE></HEAD><BODY><H1>403 ERROR</H1>"
    b"This distribution is not configured to allow the HTTP request method that was used for this request."
)


@pytest.mark.parametrize(
    "body", [INVALID_METHOD_HTML, WAF_HTML, b""], ids=["invalid-method", "waf-page", "none"]
)
def test_cloudfront_403_to_a_refused_form_is_that_requests_answer_never_a_hold(body: bytes) -> None:
    """Issue 42, item 1: CloudFront's own 403 to a method it does not allow, or to a GET with a body, is
    that request's answer: it records nothing, whatever its page says."""
    heads = {"Server": "CloudFront", "Content-Type": "text/html"}
    s = read_signal(403, heads, body, odd_form=True)
    assert s.cause is Cause.FORM and not s.cause.records
    assert read_signal(403, heads, body).cause is Cause.CLOUDFRONT  # the same 403 to a GET: a block
    # S3's denial stays S3's; a 403 from nobody known is held as before, whatever the form
    assert read_signal(403, {"Server": "AmazonS3"}, b"", odd_form=True).cause is Cause.S3_DENIED
    assert read_signal(403, {"Server": "nginx"}, b"x", odd_form=True).cause is Cause.UNKNOWN_403
