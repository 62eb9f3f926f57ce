"""The front door's last gaps (issue 25 items 6 and 11, issue 26 item 7), with real proxy processes and
real clients: a client that speaks TLS to the plain proxy port, CONNECT to an IP literal, and the
bucket's accelerate names."""

from __future__ import annotations

import subprocess

import pytest
import requests

from tests.support.processes import need_tool, wait_for
from tests.support.proxy_proc import ProxyProc

FIX = "use http:// for the proxy URL"


def _https_proxy_curl(p: ProxyProc) -> subprocess.CompletedProcess[str]:
    curl = need_tool("curl")
    cmd = [curl, "-sS", "--max-time", "20", "-x", f"https://127.0.0.1:{p.port}", "--proxy-insecure"]
    return subprocess.run(
        [*cmd, "https://data.commoncrawl.org/x"], capture_output=True, text=True, timeout=30
    )


def test_tls_to_the_proxy_port_logs_the_fix(shared_fast_proxy: ProxyProc) -> None:
    """Issue 26 item 7: curl and requests given an https:// proxy URL. The proxy closes the connection
    and logs one line naming the fix, never "malformed request"; plain clients are served after."""
    p = shared_fast_proxy
    r = _https_proxy_curl(p)
    assert r.returncode != 0
    with pytest.raises(requests.RequestException):
        requests.get(
            "https://data.commoncrawl.org/x",
            proxies={"https": f"https://127.0.0.1:{p.port}"},
            timeout=20,
            verify=False,
        )
    wait_for(lambda: p.log_since().count(FIX) >= 2, 10, "the fix line, once per client connection")
    log = p.log_since()
    assert "malformed request" not in log, log
    line = next(x for x in log.splitlines() if FIX in x)
    assert "HTTPS_PROXY=http://" in line and "127.0.0.1" in line, line
    assert requests.get(f"{p.url}/healthz", timeout=10).status_code == 200
