"""Memory stays bounded: 256 MiB downloads and uploads stream through, and a client that stops reading
makes the upstream wait instead of the proxy buffer. Peak RSS (VmHWM) readings need a proxy of their own
per test, so these live with the slow tests (the issue puts RSS checks there).
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
import requests

from tests.support.processes import need_tool
from tests.support.proxy_proc import ProxyProc
from tests.support.proxyio import (
    ProxyFactory,
    blocks,
    bundle,
    ca_pem,
    metric_value,
    proc_mem_kib,
    proxies,
    start_with,
    still_serves,
    tls_through_proxy,
)
from tests.support.upstream_proc import Certs, Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow


@pytest.fixture
def fast_proxy(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> ProxyProc:
    return start_with(proxy_factory, upstream, certs)


def test_256mib_body_streams_in_bounded_memory(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    curl = need_tool("curl")
    size = 256 * 1024 * 1024
    pid = fast_proxy.proc.pid
    env = fast_proxy.env

    def fetch(n: int) -> str:
        r = subprocess.run(
            [curl, "-sS", "--max-time", "240", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"]
            + [f"https://data.commoncrawl.org/size/{n}"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert fetch(4 * 1024 * 1024) == f"200 {4 * 1024 * 1024}"  # warm up: leaf, pool, buffers
    before = proc_mem_kib(pid)
    assert fetch(size) == f"200 {size}"
    after = proc_mem_kib(pid)
    grew = (after["VmHWM"] - before["VmHWM"]) / 1024
    assert grew < 64, f"peak RSS grew by {grew:.1f} MiB streaming 256 MiB (before {before}, after {after})"
    assert metric_value(fast_proxy, "politeproxy_bytes_total", 'direction="upstream_to_client"') >= size


@pytest.mark.parametrize("kind", ["intercepted", "plain"])
def test_stalled_client_does_not_make_the_proxy_buffer(
    fast_proxy: ProxyProc, upstream: Upstream, kind: str
) -> None:
    """A client that stops reading: backpressure reaches the upstream instead of the proxy's memory."""
    pid = fast_proxy.proc.pid
    size = 256 * 1024 * 1024
    still_serves(fast_proxy)  # warm up
    before = proc_mem_kib(pid)
    s: socket.socket
    if kind == "intercepted":
        s = tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy))
        s.sendall(f"GET /size/{size} HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n".encode())
    else:
        s = socket.create_connection(("127.0.0.1", fast_proxy.port), timeout=30)
        host = "Host: data.commoncrawl.org\r\n"
        s.sendall(f"GET http://data.commoncrawl.org/size/{size} HTTP/1.1\r\n{host}\r\n".encode())
    with s:
        s.recv(1024)  # the answer has started
        # Give the upstream every chance to push the whole body into the proxy while we read nothing.

        def relayed() -> float:
            return metric_value(fast_proxy, "politeproxy_bytes_total", 'direction="upstream_to_client"')

        last = -1.0
        for _ in range(100):
            time.sleep(0.1)
            now = relayed()
            if now == last:
                break
            last = now
        time.sleep(1.0)
        after = proc_mem_kib(pid)
        grew = (after["VmHWM"] - before["VmHWM"]) / 1024
        assert grew < 64, f"peak RSS grew by {grew:.1f} MiB with a stalled client ({before} -> {after})"
        assert relayed() < size / 2, (
            "the proxy claims to have relayed most of the body to a client that read nothing"
        )
    still_serves(fast_proxy)


def test_256mib_upload_streams_in_bounded_memory(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    size = 256 * 1024 * 1024
    pid = fast_proxy.proc.pid
    with requests.Session() as s:
        s.trust_env = False
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        # to the web site: data.commoncrawl.org refuses a POST by its form (issue 42)
        r = s.post("https://commoncrawl.org/echo", data=blocks(4 * 1024 * 1024), timeout=60)  # warm up
        assert r.status_code == 200
        before = proc_mem_kib(pid)
        r = s.post("https://commoncrawl.org/echo", data=blocks(size, 1 << 20), timeout=240)
        after = proc_mem_kib(pid)
    assert r.status_code == 200, r.text
    assert r.json()["body_length"] == size
    grew = (after["VmHWM"] - before["VmHWM"]) / 1024
    assert grew < 64, f"peak RSS grew by {grew:.1f} MiB streaming a 256 MiB upload ({before} -> {after})"
