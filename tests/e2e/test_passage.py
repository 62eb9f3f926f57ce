"""Proof of passage (issue 13): Via on every answer to an intercepted request (appended to the upstream's),
the wait and the pipeline on paced and exempt answers, and on the proxy's own refusals inside the tunnel.

One fake upstream, one small TLS server that sends its own Via (as CloudFront does), and one proxy for the
whole module.
"""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from politeproxy import __version__
from tests.support.processes import need_tool, wait_for
from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.proxyio import exchange, tls_through_proxy
from tests.support.upstream_proc import CC_HOSTS, OTHER_HOSTS, Certs, Upstream, start_upstream

CLOUDFRONT_VIA = "1.1 abc123.cloudfront.net (CloudFront)"
GAP = 0.3  # seconds between paced grants in this module's proxy


class _ViaHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"from behind a CDN\n"
        self.send_response(200)
        self.send_header("Via", CLOUDFRONT_VIA)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass


@pytest.fixture(scope="module")
def via_server(certs: Certs) -> Iterator[int]:
    """A TLS origin that answers with its own Via header (the proxy must append, not replace)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ViaHandler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certs.server_pem))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.fixture(scope="module")
def up(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = start_upstream(certs, tmp_path_factory.mktemp("passage-up"))
    yield u
    u.stop()


@pytest.fixture(scope="module")
def proxy(
    up: Upstream, via_server: int, certs: Certs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProc]:
    # commoncrawl.org goes to the Via server; every other name to the fake upstream.
    resolve = [
        f'"{h}:443" = "127.0.0.1:{via_server if h == "commoncrawl.org" else up.port}"'
        for h in (*CC_HOSTS, *OTHER_HOSTS)
    ]
    resolve += [f'"{h}:80" = "127.0.0.1:{up.plain_port}"' for h in (*CC_HOSTS, *OTHER_HOSTS)]
    toml = (
        f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n' + "\n".join(resolve) + "\n"
        f'[robots]\nenabled = false\n[schedule]\nglobal_rate = "{int(GAP * 1000)}ms"\n'
        '[hosts."index.commoncrawl.org"]\ninterval = "0s"\n'
    )
    p = start_proxy(tmp_path_factory.mktemp("passage"), None, None, toml)
    yield p
    p.stop()


def _get(proxy: ProxyProc, url: str, user: str = "", **kw: object) -> requests.Response:
    proxy_url = proxy.url.replace("http://", f"http://{user}:@") if user else proxy.url
    return requests.get(
        url,
        proxies={"https": proxy_url, "http": proxy_url},
        verify=str(proxy.data_dir / "ca-bundle.pem"),
        timeout=30,
        **kw,  # type: ignore[arg-type]
    )


def test_curl_shows_via_wait_and_pipeline(proxy: ProxyProc) -> None:
    """The README's one-line check: curl -sI through the proxy shows `via: 1.1 politeproxy`."""
    curl = need_tool("curl")
    named = proxy.url.replace("http://", "http://etl:@")
    env = {**proxy.env, "HTTPS_PROXY": named, "https_proxy": named}  # curl reads the lower-case one first
    out = subprocess.run(
        [curl, "-sI", "https://data.commoncrawl.org/size/10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.lower()
    assert "via: 1.1 politeproxy" in out, out
    assert "x-politeproxy-pipeline: etl" in out, out
    assert "x-politeproxy-wait: " in out, out


def test_via_is_appended_to_the_upstreams_own(proxy: ProxyProc) -> None:
    r = _get(proxy, "https://commoncrawl.org/x")
    assert r.status_code == 200, r.text
    assert r.headers["Via"] == f"{CLOUDFRONT_VIA}, 1.1 politeproxy"


def test_wait_header_says_how_long_each_request_was_held(proxy: ProxyProc) -> None:
    """Three requests at once on a 300 ms schedule: the last waits about two gaps, and says so."""
    time.sleep(GAP)  # the previous test's slot is spent
    with ThreadPoolExecutor(3) as pool:
        rs = list(pool.map(lambda i: _get(proxy, f"https://data.commoncrawl.org/size/{i + 1}"), range(3)))
    waits = sorted(float(r.headers["X-Politeproxy-Wait"]) for r in rs)
    assert all(r.status_code == 200 and r.headers["Via"] == "1.1 politeproxy" for r in rs)
    assert waits[-1] >= 1.5 * GAP, waits  # two gaps behind the first, give or take jitter
    assert waits[0] < waits[-1]
    assert {r.headers["X-Politeproxy-Pipeline"] for r in rs} == {"127.0.0.1"}  # no user: the address


def test_exempt_and_passthrough_answers(proxy: ProxyProc) -> None:
    r = _get(
        proxy, "https://data.commoncrawl.org/cc-index/table/x.parquet", "duck", headers={"Range": "bytes=0-9"}
    )
    assert r.headers["Via"] == "1.1 politeproxy"
    assert r.headers["X-Politeproxy-Pipeline"] == "duck" and float(r.headers["X-Politeproxy-Wait"]) >= 0
    # A host that is not paced, by plain HTTP through the proxy: Via, but nothing was held.
    r = requests.get("http://other.example/echo", proxies={"http": proxy.url}, timeout=30)
    assert r.status_code == 200 and r.headers["Via"] == "1.1 politeproxy"
    assert "X-Politeproxy-Wait" not in r.headers and "X-Politeproxy-Pipeline" not in r.headers


def test_signed_request_headers_reach_the_upstream_untouched(proxy: ProxyProc) -> None:
    sent = {
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=abc",
        "x-amz-date": "20240101T000000Z",
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
    }
    r = _get(proxy, "https://commoncrawl.s3.amazonaws.com/echo", headers=sent)
    seen = {k.lower(): v for k, v in json.loads(r.text)["headers"]}
    for k, v in sent.items():
        assert seen[k.lower()] == v
    assert "via" not in seen and not any(k.startswith("x-politeproxy") for k in seen)
    assert r.headers["Via"] == "1.1 politeproxy"


def test_the_proxys_own_answers_inside_the_tunnel_carry_via(proxy: ProxyProc) -> None:
    with tls_through_proxy(proxy.port, "data.commoncrawl.org", proxy.data_dir / "ca.pem") as s:
        resp = exchange(s, b"GET /echo HTTP/1.1\r\nHost: other.example\r\n\r\n")  # misdirected
        assert resp.status == 421 and resp.getheader("Via") == "1.1 politeproxy"
    with tls_through_proxy(proxy.port, "data.commoncrawl.org", proxy.data_dir / "ca.pem") as s:
        resp = exchange(s, b"GET /echo HTTP/1.1\r\n\r\n")  # no Host: malformed, aiohttp's own 400
        assert resp.status == 400 and resp.getheader("Via") == "1.1 politeproxy"
    with tls_through_proxy(proxy.port, "data.commoncrawl.org", proxy.data_dir / "ca.pem") as s:
        resp = exchange(
            s, b"GET /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\nX-" + b"a" * 70000 + b": 1\r\n\r\n"
        )
        assert resp.status in (400, 431) and resp.getheader("Via") == "1.1 politeproxy"


def test_a_refusal_while_blocked_says_via_wait_and_pipeline(proxy: ProxyProc, up: Upstream) -> None:
    """A 403 blocks the host for minutes: the next request is refused at once by the proxy itself."""
    host = "commoncrawl.s3.us-east-1.amazonaws.com"
    up.control({"throttle": {"host": host, "count": 1, "status": 403}})
    first = _get(proxy, f"https://{host}/a", "etl")
    assert first.status_code == 403 and first.headers["Via"] == "1.1 politeproxy"  # relayed
    second = _get(proxy, f"https://{host}/b", "etl")
    assert second.status_code == 503 and "blocked" in second.text, second.text
    assert second.headers["Via"] == "1.1 politeproxy"
    assert second.headers["X-Politeproxy-Pipeline"] == "etl"
    assert float(second.headers["X-Politeproxy-Wait"]) < 5
    log = proxy.log()
    assert f"{host}: 403 from upstream: blocked for" in log
    assert "etl: refused 503:" in log


def test_access_line_names_path_pipeline_and_retries(proxy: ProxyProc) -> None:
    _get(proxy, "https://index.commoncrawl.org/echo?url=example.com&X-Amz-Signature=secret", "cdx")

    def lines() -> list[str]:  # the access line is written just after the answer's last byte
        return [ln for ln in proxy.log().splitlines() if "politeproxy.access" in ln and "/echo?..." in ln]

    wait_for(lambda: bool(lines()), 10, "access line")
    line = lines()[-1]
    assert "index.commoncrawl.org/echo?... paced" in line, line
    assert "retries=0" in line and "pipeline=cdx" in line and "status=200" in line
    assert "secret" not in line and "url=example.com" not in line


def test_metrics_are_tidy(proxy: ProxyProc) -> None:
    """build_info; no _created; the configured hosts' label sets exist at 0 (pipeline "default" is never
    a real client's here, so its lines stay 0 whatever the other tests sent)."""
    text = proxy.metrics()
    assert "_created" not in text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    info = [s for s in samples if s.name == "politeproxy_build_info"]
    assert len(info) == 1 and info[0].labels["version"] == __version__ and info[0].value == 1
    for host in ("data.commoncrawl.org", "index.commoncrawl.org", "commoncrawl.org"):
        for name in ("politeproxy_requests_total", "politeproxy_grants_total", "politeproxy_rejected_total"):
            zero = [
                s.value
                for s in samples
                if s.name == name
                and s.labels["host"] == host
                and s.labels["pipeline"] == "default"
                and s.labels.get("reason") in (None, "max_wait", "queue_full")  # 421s count as "default"
            ]
            assert zero and all(v == 0 for v in zero), (name, host)
