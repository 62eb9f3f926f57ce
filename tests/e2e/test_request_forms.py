"""Issue 42, item 1: a request of a form Common Crawl's services refuse by themselves never leaves.

CloudFront answers a method its distribution does not allow, and a GET with a body, with its own 403 with
``Server: CloudFront``. Read as the WAF's block, one such request from one client held the host for every
pipeline. The fake upstream here answers like CloudFront (throttle with "forms": only those forms get the
403), so a proxy that let one through would hold data.commoncrawl.org and refuse the GET that follows.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
import requests

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, for_this_test
from tests.support.throttling import arrivals
from tests.support.tlsclient import client_context
from tests.support.upstream_proc import Upstream

DATA, INDEX, WWW = "data.commoncrawl.org", "index.commoncrawl.org", "commoncrawl.org"
CLOUDFRONT_403 = {"Server": "CloudFront", "Content-Type": "text/html", "X-Cache": "Error from cloudfront"}
INVALID_METHOD = (
    "<HTML><HEAD><TITLE>ERROR: The request could not be satisfied</TITLE></HEAD><BODY><H1>403 ERROR</H1>"
    "This distribution is not configured to allow the HTTP request method that was used for this request."
)


def cloudfront_like(up: Upstream, host: str) -> None:
    """``host`` answers what CloudFront refuses by its form with its own 403 (the rest as usual)."""
    up.control(
        {"throttle": {"host": host, "count": 100, "status": 403, "retry_after": None, "forms": True,
                      "headers": CLOUDFRONT_403, "body": INVALID_METHOD}}
    )  # fmt: skip


@pytest.fixture(scope="module")
def module_cp(module_proxy_factory: Callable[..., ProxyProc], module_upstream: Upstream) -> ProxyProc:
    return module_proxy_factory(module_upstream, NO_ROBOTS + '[pacing]\nmax_wait = "5s"\n')


@pytest.fixture
def cp(module_cp: ProxyProc) -> ProxyProc:
    return for_this_test(module_cp)


@pytest.fixture
def upstream(shared_upstream: Upstream) -> Upstream:
    return shared_upstream


def body_get(env: dict[str, str], host: str) -> tuple[int, dict[str, str], bytes]:
    """A GET with a one-byte body inside a tunnel, written by hand (clients do not send one)."""
    return _raw(env, host, b"GET /size/10 HTTP/1.1\r\nHost: %s\r\nContent-Length: 1\r\n\r\nx" % host.encode())


def _raw(env: dict[str, str], host: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    port = int(env["HTTPS_PROXY"].rsplit(":", 1)[1].strip("/"))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        with client_context(env["SSL_CERT_FILE"]).wrap_socket(s, server_hostname=host) as t:
            t.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := t.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            while len(body) < int(headers.get("content-length", "0")) and (chunk := t.recv(65536)):
                body += chunk
    return int(lines[0].split()[1]), headers, body


ODD = [
    pytest.param(DATA, "DELETE", 405, id="DELETE-data"),
    pytest.param(DATA, "POST", 405, id="POST-data"),
    pytest.param(DATA, "PUT", 405, id="PUT-data"),
    pytest.param(DATA, "OPTIONS", 405, id="OPTIONS-data"),
    pytest.param(DATA, "GET+body", 400, id="GET-with-body-data"),
    pytest.param(INDEX, "POST", 405, id="POST-index"),
    pytest.param(INDEX, "GET+body", 400, id="GET-with-body-index"),
]


@pytest.mark.parametrize(("host", "form", "status"), ODD)
def test_any_client_could_make_cloudfront_answer_403_and_block_the_host_for_every_pipeline(
    cp: ProxyProc, upstream: Upstream, host: str, form: str, status: int
) -> None:
    cloudfront_like(upstream, host)
    if form == "GET+body":
        got, headers, body = body_get(cp.env, host)
    else:
        got, headers, body = tunnel_get(
            cp.env, host, "/crawl-data/x", method=form, headers={"Content-Length": "0"}
        )
    assert got == status, body
    assert (headers.get("allow") == "GET, HEAD") == (status == 405)
    assert b"politeproxy:" in body and b"CloudFront refuses" in body
    assert arrivals(upstream, host) == []  # it never left: no slot, no count in the window
    # the next plain GET, from anyone, goes at once: nothing holds the host
    ok, _, _ = tunnel_get(cp.env, host, "/size/10")
    assert ok == 200
    assert [a["method"] for a in arrivals(upstream, host)] == ["GET"]


def test_a_plain_http_request_of_a_refused_form_is_answered_too(cp: ProxyProc, upstream: Upstream) -> None:
    cloudfront_like(upstream, DATA)
    proxies = {"http": cp.url}
    r = requests.post(f"http://{DATA}/crawl-data/x", data=b"x", proxies=proxies, timeout=30)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
    assert arrivals(upstream, DATA) == []
    assert requests.get(f"http://{DATA}/size/10", proxies=proxies, timeout=30).status_code == 200


def test_a_cloudfront_403_to_a_form_it_refuses_is_that_requests_answer_never_a_hold(
    cp: ProxyProc, upstream: Upstream
) -> None:
    """The web site's rules are not known to the proxy, so a POST there goes; CloudFront's 403 to it is
    passed on as that request's answer, and the host is not held."""
    cloudfront_like(upstream, WWW)
    got, headers, body = tunnel_get(cp.env, WWW, "/form", method="POST", headers={"Content-Length": "0"})
    assert got == 403 and headers.get("server") == "CloudFront" and b"not configured to allow" in body
    ok, _, _ = tunnel_get(cp.env, WWW, "/size/10")
    assert ok == 200  # a hold would answer 503 here
    assert [a["method"] for a in arrivals(upstream, WWW)] == ["POST", "GET"]
    assert "blocked for" not in cp.log_since()
