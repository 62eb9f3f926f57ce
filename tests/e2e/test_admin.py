"""The admin endpoints answered in one place (politeproxy/observe/admin.py): --metrics-listen gives the same
answers as the proxy port, and the access line is one record, plain or JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import free_port, need_tool, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import bundle, proxies
from tests.support.upstream_proc import Upstream


def _answer(r: requests.Response) -> tuple[int, str, bytes]:
    return r.status_code, r.headers.get("Content-Type", ""), r.content


def _answered_2xx(text: str) -> float:
    """politeproxy_requests_total for data.commoncrawl.org, code 2xx, summed over the other labels."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "politeproxy_requests_total"
        and s.labels.get("host") == "data.commoncrawl.org"
        and s.labels.get("code") == "2xx"
    )


@pytest.mark.slow  # a proxy of its own with a second listener: ~3 s
def test_metrics_listen_serves_the_same_admin_answers(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Every admin path and refusal is answered alike on the proxy port and on --metrics-listen: /ca.pem
    (which --metrics-listen did not serve before admin.py), /healthz, a 404 and a 405."""
    port = free_port()
    p = proxy_factory(upstream, NO_ROBOTS, args=("--metrics-listen", f"127.0.0.1:{port}"))
    wait_for(lambda: "metrics on" in p.log(), 10, "the metrics start line")
    r = requests.get(
        "https://data.commoncrawl.org/echo", proxies=proxies(p), verify=str(bundle(p)), timeout=30
    )
    assert r.status_code == 200
    side = f"http://127.0.0.1:{port}"
    for method, path in [("GET", "/healthz"), ("GET", "/ca.pem"), ("GET", "/nope"), ("POST", "/metrics")]:
        a = requests.request(method, p.url + path, timeout=10)
        b = requests.request(method, side + path, timeout=10)
        assert _answer(a) == _answer(b), (method, path, _answer(a), _answer(b))
    assert requests.get(side + "/ca.pem", timeout=10).content == (p.data_dir / "ca.pem").read_bytes()
    assert requests.get(side + "/nope", timeout=10).status_code == 404
    assert requests.post(side + "/metrics", timeout=10).status_code == 405
    health = requests.get(side + "/healthz", timeout=10).json()
    assert health["status"] == "ok" and {"store", "degraded", "queued"} <= health.keys()
    # /metrics: one registry behind both, so both show the request made above.
    a, b = requests.get(p.url + "/metrics", timeout=10), requests.get(side + "/metrics", timeout=10)
    assert a.status_code == b.status_code == 200
    assert a.headers["Content-Type"] == b.headers["Content-Type"]
    assert a.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert _answered_2xx(a.text) == _answered_2xx(b.text) == 1.0, a.text
    assert requests.head(side + "/metrics", timeout=10).status_code == 200


def test_json_access_line_is_one_flat_object(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """--log-format json: the access line's fields sit at the top level (no "message", no JSON in a
    string), and carries the values of the exchange."""
    p = proxy_factory(upstream, NO_ROBOTS, args=("--log-format", "json"))
    r = requests.get(
        "https://data.commoncrawl.org/echo?j=1", proxies=proxies(p), verify=str(bundle(p)), timeout=30
    )
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    lines: list[dict[str, object]] = []
    while not lines and time.monotonic() < deadline:
        objs = [json.loads(x) for x in p.log().splitlines() if x.strip()]
        lines = [o for o in objs if o.get("logger") == "politeproxy.access"]
        time.sleep(0.1)
    assert lines, p.log()
    a = lines[0]
    assert "message" not in a, a
    assert a["method"] == "GET" and a["host"] == "data.commoncrawl.org" and a["class"] == "paced"
    assert a["status"] == 200 and a["bytes"] == len(r.content) and a["client"] == "127.0.0.1"
    assert isinstance(a["wait"], float | int) and isinstance(a["duration"], float | int)
    assert a["level"] == "info" and isinstance(a["ts"], float)
    assert "note" not in a


def test_admin_paths_answer_only_names_of_this_proxy(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Issue 25 item 8 (a DNS-rebinding guard): /status, the status page, /metrics and /healthz answer an
    IP literal, localhost, this machine's name and the deploy files' service name (politeproxy:3128,
    which deploy/prometheus.yml scrapes) as Host, on the proxy port and on --metrics-listen; any other
    name gets a 421 that names the key. curl --resolve plays the rebinding page's browser. /ca.pem is
    public and answers any Host."""
    side_port = free_port()
    p = proxy_factory(upstream, NO_ROBOTS, args=("--metrics-listen", f"127.0.0.1:{side_port}"))
    wait_for(lambda: "metrics on" in p.log(), 10, "the metrics start line")
    curl = need_tool("curl")
    for port in (p.port, side_port):
        for path in ("/status", "/", "/metrics", "/healthz"):
            for host in ("evil.example", "rebind.attacker.test:80", "politeproxy.evil.example"):
                r = requests.get(f"http://127.0.0.1:{port}{path}", headers={"Host": host}, timeout=10)
                assert r.status_code == 421, (port, path, host, r.status_code)
                assert "admin_hosts" in r.text and r.text.count("\n") == 1, r.text
            for host in (
                "127.0.0.1",
                f"127.0.0.1:{port}",
                f"[::1]:{port}",
                f"localhost:{port}",
                "politeproxy:3128",
                socket.gethostname(),
                "app.localhost",
            ):
                r = requests.get(f"http://127.0.0.1:{port}{path}", headers={"Host": host}, timeout=10)
                assert r.status_code == 200, (port, path, host, r.status_code, r.text[:200])
        rebound = subprocess.run(
            [
                curl,
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--resolve",
                f"evil.example:{port}:127.0.0.1",
                f"http://evil.example:{port}/status",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert rebound.stdout == "421", rebound
        ca = requests.get(f"http://127.0.0.1:{port}/ca.pem", headers={"Host": "evil.example"}, timeout=10)
        assert ca.status_code == 200 and ca.content == (p.data_dir / "ca.pem").read_bytes()
    # Proxying is not an admin path: a foreign Host on a proxied request is the upstream's business.
    r = requests.get("http://data.commoncrawl.org/echo", proxies={"http": p.url}, timeout=30)
    assert r.status_code == 200
