"""policy/answers.py: the proxy's own answers as each client reads them (issue 41). Every field is read back
with http-sf (an RFC 8941/9651 parser) and the S3 error with the standard library's XML parser; the
properties run over arbitrary text, since a refusal's reason carries host names and upstream words."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import http_sf
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.answers import (
    DENIED,
    MAX_DETAILS,
    Quota,
    Stagger,
    cache_status,
    error_type,
    proxy_status,
    rate_quota,
    s3_code,
    s3_error,
    sf_string,
    window_quota,
)


def parse_list(text: str) -> list[tuple[object, dict[str, object]]]:
    parsed: list[tuple[object, dict[str, object]]] = http_sf.parse(text.encode(), tltype="list")
    return parsed


@given(st.text(max_size=400))
def test_any_reason_is_a_valid_details_string(text: str) -> None:
    [(name, params)] = parse_list(proxy_status(DENIED, text or "x"))
    assert str(name) == "politeproxy" and str(params["error"]) == DENIED
    details = params["details"]
    assert isinstance(details, str) and len(details) <= MAX_DETAILS
    # printable ASCII survives as it was; anything else is one "?" per character
    kept = "".join(ch if " " <= ch <= "~" else "?" for ch in (text or "x")[:MAX_DETAILS])
    assert details == kept


@given(st.text(max_size=50))
def test_sf_string_round_trips_printable_ascii(text: str) -> None:
    ascii_text = "".join(ch for ch in text if " " <= ch <= "~")
    assert http_sf.parse(sf_string(ascii_text).encode(), tltype="item")[0] == ascii_text


def test_proxy_status_error_types_come_from_rfc_9209s_registry() -> None:
    registry = {
        "dns_error", "connection_refused", "connection_timeout", "connection_limit_reached",
        "tls_certificate_error", "http_request_error", "http_request_denied", "destination_unavailable",
        "proxy_internal_error",
    }  # fmt: skip
    for status in (400, 403, 405, 407, 421, 431, 500, 502, 503, 504, 418, 599):
        assert error_type(status) in registry
    assert error_type(502, "tls") == "tls_certificate_error" and error_type(502, "dns") == "dns_error"
    assert error_type(503) == "http_request_denied" and error_type(502, "refused") == "connection_refused"


def test_cache_status_hit_and_forwarded() -> None:
    [(name, params)] = parse_list(cache_status("hit"))
    assert str(name) == "politeproxy" and params == {"hit": True}
    [(_, params)] = parse_list(cache_status("miss", stored=True))
    assert str(params["fwd"]) == "miss" and params["stored"] is True
    [(_, params)] = parse_list(cache_status("stale"))
    assert str(params["fwd"]) == "stale" and "stored" not in params
    [(_, params)] = parse_list(cache_status("bypass"))
    assert str(params["fwd"]) == "bypass"


@given(st.integers(0, 10**7), st.floats(1, 86400), st.integers(-5, 10**7))
def test_the_window_as_ratelimit_fields(limit: int, window: float, used: int) -> None:
    q = window_quota(limit, window, used)
    [(name, policy)] = parse_list(q.policy_field())
    [(name2, left)] = parse_list(q.field())
    assert name == name2 == "window"
    assert policy == {"q": limit, "w": math.ceil(window - 1e-9)}
    assert left["r"] == max(0, min(limit, limit - max(0, used)))
    assert 0 <= left["t"] <= math.ceil(window)  # type: ignore[operator]


def test_with_the_window_off_the_paced_rate_is_a_one_second_quota() -> None:
    assert rate_quota(0.2, 0.0) == Quota(5, 1.0, 5, 0.0)
    assert rate_quota(0.2, 3.2).field() == '"window";r=0;t=4'
    assert rate_quota(0.0, 0.0).remaining == 1 and rate_quota(float("nan"), 0.0).limit == 1


@given(st.text(max_size=500), st.text(max_size=100))
def test_the_s3_error_parses_whatever_the_reason(message: str, resource: str) -> None:
    doc = ET.fromstring(s3_error("SlowDown", message, "ABC123", resource))
    assert doc.tag == "Error" and doc.findtext("Code") == "SlowDown" and doc.findtext("RequestId") == "ABC123"
    assert len(doc.findtext("Message") or "") <= MAX_DETAILS


def test_s3_codes_for_the_proxys_own_answers() -> None:
    assert (
        s3_code(503) == "SlowDown" and s3_code(405) == "MethodNotAllowed" and s3_code(500) == "InternalError"
    )
    assert s3_code(502) == "InternalError" and s3_code(400) == "InvalidRequest"


def test_refusals_are_told_to_come_back_one_slot_apart_within_the_cap() -> None:
    s = Stagger(cap=5.0)
    after = [s.advise("bucket", 100.0, 0.0, 5.0, 0.05) for _ in range(100)]
    assert after[0] == 0.001 and all(0 < a <= 5.0 for a in after)
    assert all(round(b - a, 6) == 0.05 for a, b in zip(after[1:], after[2:], strict=False) if b < 4.9)
    # their own turn inside the bound: 7 s of wait under a 5 s bound comes back after 2 s at the earliest
    assert Stagger().advise("data", 0.0, 7.0, 5.0, 0.05) == 2.0


@given(
    st.lists(
        st.tuples(st.floats(allow_nan=True), st.floats(allow_nan=True), st.floats(allow_nan=True)),
        max_size=60,
    )
)
def test_stagger_never_leaves_its_bounds(asks: list[tuple[float, float, float]]) -> None:
    s = Stagger(cap=5.0, max_keys=4)
    for i, (wait, bound, spacing) in enumerate(asks):
        a = s.advise(f"k{i % 7}", float(i), wait, bound, spacing)
        assert 0 < a <= 5.0
    assert len(s._next) <= 4
