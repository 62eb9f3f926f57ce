"""The first thing a new user does: curl through the proxy to an intercepted and a tunnelled host."""

from __future__ import annotations

import json
import subprocess

from tests.support.processes import need_tool
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream


def curl(proxy: ProxyProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("curl"), "-sS", "--max-time", "20", *args], env=proxy.env, capture_output=True, text=True
    )


def test_curl_intercepted_and_tunnelled(proxy: ProxyProc, upstream: Upstream, certs) -> None:
    r = curl(proxy, "https://data.commoncrawl.org/echo?x=1")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["path"] == "/echo?x=1"
    # A non-paced host: blind tunnel, so curl sees the upstream's own certificate (its CA, not ours).
    r = curl(proxy, "--cacert", str(certs.ca_file), "https://other.example/hello")
    assert r.returncode == 0, r.stderr
    assert "hello from other.example" in r.stdout
    r = curl(proxy, "-o", "/dev/null", "-w", "%{http_code}", "https://other.example/hello")
    assert r.returncode != 0  # our CA bundle does not vouch for other.example: the proxy never touched it
