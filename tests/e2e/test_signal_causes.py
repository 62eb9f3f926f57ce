"""Signals read by their cause (issue 24, item 4), end to end against the local TLS upstream: a 403 from S3
answers its one request and holds nothing; CloudFront's own 403 and a 403 from nobody known hold the host
(the /status document names why); a 404 never throttles; a proxy that does not trust the upstream's
certificate answers 502 naming ``--upstream-ca`` and records nothing, so the proxy restarted with the CA
sends at once."""

from __future__ import annotations

import json
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.throttling import arrivals, throttle
from tests.support.upstream_proc import Certs, Upstream, resolve_table

DATA = "data.commoncrawl.org"
HOLD = 3.0  # block_hold: longer than max_wait, so a held request is refused at once (the test stays short)
CONFIG = (
    NO_ROBOTS
    + '[schedule]\nglobal_rate = "50ms"\n'
    + f'[pacing]\nbackoff_jitter = 0.0\nblock_hold = "{HOLD}s"\nmax_wait = "1s"\nretries = 0\n'
    + "adaptive = false\n"
)
S3_DENIED = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)
S3_HEADERS = {"Server": "AmazonS3", "Content-Type": "application/xml", "X-Cache": "Error from cloudfront"}
WAF_PAGE = (
    "<!DOCTYPE HTML><HTML><BODY><H1>403 ERROR</H1>"
    "Request blocked. We can't connect to the server.</BODY></HTML>"
)


def status_row(p: ProxyProc, host: str) -> dict[str, Any]:
    with urllib.request.urlopen(p.url + "/status", timeout=10) as r:
        doc = json.loads(r.read())
    return next(h for h in doc["hosts"] if h["host"] == host)


def store_record(data_dir: Path, host: str) -> tuple[float, int]:
    """The file store's backoff_until (seconds) and throttle count for ``host`` (0, 0 without a record)."""
    path = data_dir / "hosts" / host
    if not path.exists():
        return 0.0, 0
    _nxt, until, _robots, throttles, _delay = struct.unpack(">QQQQQ", path.read_bytes()[:40])
    return until / 1e9, throttles


def test_an_s3_403_answers_its_request_and_holds_nothing(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, DATA, 1, None, 403, S3_HEADERS, S3_DENIED)
    code, headers, body = tunnel_get(p.env, DATA, "/size/5?denied")
    assert code == 403 and headers.get("server") == "AmazonS3" and body.decode() == S3_DENIED
    assert "retry-after" not in headers  # not a throttle: it would send the client back for the same 403
    code, _, _ = tunnel_get(p.env, DATA, "/size/5?next")
    assert code == 200
    ts = {a["path"]: a["t"] for a in arrivals(upstream, DATA)}
    assert ts["/size/5?next"] - ts["/size/5?denied"] < 1.0, ts
    assert store_record(p.data_dir, DATA) == (0.0, 0)
    assert status_row(p, DATA)["state"] == "ok"


def test_s3s_xml_without_its_server_is_read_from_the_body_and_passed_on_unchanged(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """No Server to say who: the first bytes of the body do, and the client still gets every byte."""
    p = proxy_factory(upstream, CONFIG)
    long_body = S3_DENIED + "<!--" + "x" * 100_000 + "-->"
    throttle(upstream, DATA, 1, None, 403, {"Content-Type": "application/xml", "Server": ""}, long_body)
    code, _, body = tunnel_get(p.env, DATA, "/size/5?denied")
    assert code == 403 and body.decode() == long_body
    t0 = time.monotonic()
    assert tunnel_get(p.env, DATA, "/size/5?next")[0] == 200
    assert time.monotonic() - t0 < 1.0
    assert store_record(p.data_dir, DATA) == (0.0, 0)


def test_many_s3_denials_warn_once_naming_unsigned_requests(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, DATA, 14, None, 403, S3_HEADERS, S3_DENIED)
    codes = [tunnel_get(p.env, DATA, f"/size/1?k={i}")[0] for i in range(14)]
    assert codes == [403] * 14
    log = p.log()
    assert log.count("--no-sign-request") == 1 and "unsigned" in log, log[-3000:]
    assert store_record(p.data_dir, DATA) == (0.0, 0)


def test_a_cloudfront_403_holds_the_host_and_status_names_cloudfront(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, DATA, 1, None, 403, {"Server": "CloudFront", "Content-Type": "text/html"}, WAF_PAGE)
    code, headers, body = tunnel_get(p.env, DATA, "/size/5?blocked")
    assert code == 403 and headers.get("retry-after") == str(int(HOLD)) and body.decode() == WAF_PAGE
    code, _, body = tunnel_get(p.env, DATA, "/size/5?held")
    assert code == 503 and f"{DATA} is blocked until " in body.decode(), body
    assert all(a["path"] != "/size/5?held" for a in upstream.log())
    row = status_row(p, DATA)
    assert row["state"] == "blocked" and "403 from CloudFront" in row["reason"], row
    until, _ = store_record(p.data_dir, DATA)
    assert until > time.time()


def test_a_403_from_nobody_known_still_holds_and_is_logged_with_its_headers_once(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, DATA, 1, None, 403, {"X-Cache": "Error from cloudfront"})  # that header alone: nothing
    assert tunnel_get(p.env, DATA, "/size/5?plain")[0] == 403
    code, _, body = tunnel_get(p.env, DATA, "/size/5?held")
    assert code == 503 and f"{DATA} is blocked until " in body.decode(), body
    assert "403 from an unknown server" in status_row(p, DATA)["reason"]
    log = p.log()
    assert log.count("from neither CloudFront nor S3") == 1 and "X-Cache: Error from cloudfront" in log, log


def test_a_404_never_throttles(proxy_factory: Callable[..., ProxyProc], upstream: Upstream) -> None:
    p = proxy_factory(upstream, CONFIG + "throttle_codes = [404, 429, 503]\n")
    throttle(upstream, DATA, 3, None, 404, {"Server": "CloudFront"})
    t0 = time.monotonic()
    codes = [tunnel_get(p.env, DATA, f"/size/1?k={i}")[0] for i in range(4)]
    assert codes == [404, 404, 404, 200] and time.monotonic() - t0 < 2.0
    assert store_record(p.data_dir, DATA) == (0.0, 0)


def test_without_the_upstreams_ca_a_502_names_the_fix_and_nothing_is_recorded(
    tmp_path: Path, certs: Certs, upstream: Upstream
) -> None:
    data = tmp_path / "data"
    resolve = f"[upstream.resolve]\n{resolve_table(upstream)}\n"
    bare = start_proxy(tmp_path, None, None, CONFIG + resolve, data_dir=data)
    try:
        for i in range(4):  # three failures in a row used to block the host
            code, _, body = tunnel_get(bare.env, DATA, f"/size/1?k={i}")
            assert code == 502 and b"--upstream-ca" in body and b"[upstream] ca_file" in body, body
        assert "--upstream-ca" in bare.log()
        assert store_record(data, DATA) == (0.0, 0)
    finally:
        bare.stop()
    fixed = start_proxy(
        tmp_path, None, None, CONFIG + resolve, data_dir=data, args=("--upstream-ca", str(certs.ca_file))
    )
    try:
        t0 = time.monotonic()
        code, _, _ = tunnel_get(fixed.env, DATA, "/size/1?fixed")
        assert code == 200 and time.monotonic() - t0 < 1.0
    finally:
        fixed.stop()
