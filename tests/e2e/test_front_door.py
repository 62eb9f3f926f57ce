"""The front door's last gaps (issue 25 items 6 and 11, issue 26 item 7), with real proxy processes and
real clients: a client that speaks TLS to the plain proxy port, CONNECT to an IP literal, and the
bucket's accelerate names."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator

import pytest
import requests

from politeproxy.policy.table import SETTINGS
from tests.support.processes import need_tool, wait_for
from tests.support.proxy_proc import FAST, ProxyProc, start_proxy
from tests.support.proxyio import connect_tunnel, one_line_reason, read_head, read_to_close, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

# The key is the lead's to add to policy/table.py (and app.py passes it to Proxy); until then the cases
# that turn it on are skipped, and the default (refused) is what runs.
IP_CONNECT_KEY = any(s.key == "allow_ip_connect" for s in SETTINGS)
needs_ip_connect_key = pytest.mark.skipif(not IP_CONNECT_KEY, reason="allow_ip_connect is not a setting yet")

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


@pytest.mark.parametrize(
    "host",
    [
        "commoncrawl.s3-accelerate.amazonaws.com",
        "commoncrawl.s3-accelerate.dualstack.amazonaws.com",
        "COMMONCRAWL.S3-ACCELERATE.AMAZONAWS.COM.",
    ],
)
def test_the_accelerate_names_are_refused_not_tunnelled(shared_fast_proxy: ProxyProc, host: str) -> None:
    """Issue 25 item 11: the bucket's Transfer Acceleration names reach the same objects unpaced; a
    CONNECT to one is refused with a 403 that names the paced names to use instead."""
    with socket.create_connection(("127.0.0.1", shared_fast_proxy.port), timeout=20) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        head = read_head(s)
        body = read_to_close(s)
    assert head.startswith(b"HTTP/1.1 403"), head
    text = one_line_reason(body)
    assert "commoncrawl.s3.amazonaws.com" in text and "data.commoncrawl.org" in text, text
    r = requests.get(f"http://{host}/crawl-data/x", proxies={"http": shared_fast_proxy.url}, timeout=20)
    assert r.status_code == 403 and "commoncrawl.s3.amazonaws.com" in r.text, r.text  # plain http:// too


def test_ip_connect_is_refused_by_default(shared_fast_proxy: ProxyProc, shared_upstream: Upstream) -> None:
    """Issue 25 item 6: a CONNECT to an IP literal has no name to pace or sign for: 403, whose body
    names the rule and the key, before any connection is tried (the old tree tried 127.0.0.1:443 and
    answered 502). curl (-p) and requests see the refusal as a failed CONNECT."""
    p, up = shared_fast_proxy, shared_upstream
    before = p.metric("politeproxy_rejected_total", 'reason="destination"')
    s, head = connect_tunnel(p.port, "127.0.0.1:443")
    with s:
        body = read_to_close(s)
    assert head.startswith(b"HTTP/1.1 403"), head
    text = one_line_reason(body)
    assert "IP address" in text and "allow_ip_connect" in text, text
    curl = subprocess.run(
        [need_tool("curl"), "-sS", "-p", "-x", p.url, "-k", "https://127.0.0.1/x"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert curl.returncode != 0 and "403" in curl.stderr, curl.stderr
    with pytest.raises(requests.exceptions.ProxyError):
        requests.get("https://[::1]/x", proxies={"https": p.url}, timeout=20, verify=False)
    assert p.metric("politeproxy_rejected_total", 'reason="destination"') == before + 3
    # A plain http:// request by address: the same rule (here the address data.commoncrawl.org:80 is
    # mapped to, which the old tree forwarded unpaced).
    r = requests.get(f"http://127.0.0.1:{up.plain_port}/x", proxies={"http": p.url}, timeout=20)
    assert r.status_code == 403 and "allow_ip_connect" in r.text, r.text
    assert up.log() == []  # nothing reached the upstream


class _Echo:
    """A TCP echo server on loopback: an address no paced name resolves to."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass


@pytest.fixture
def ip_proxy(
    module_upstream: Upstream, certs: Certs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProc, _Echo]]:
    echo = _Echo()
    top = f"allow_ip_connect = true\ntunnel_ports = [443, {module_upstream.port}, {echo.port}]\n"
    text = FAST + upstream_toml(module_upstream, certs)
    p = start_proxy(tmp_path_factory.mktemp("ip-connect"), None, None, text, top_toml=top)
    yield p, echo
    p.stop()
    echo.sock.close()


@needs_ip_connect_key
def test_allow_ip_connect_tunnels_only_addresses_no_paced_name_resolves_to(
    ip_proxy: tuple[ProxyProc, _Echo], module_upstream: Upstream
) -> None:
    """With allow_ip_connect: an address no paced name resolves to is tunnelled; the address that
    data.commoncrawl.org is mapped to is closed after the peek when the TLS hello names no paced host
    (nothing reaches the upstream), and the log says which name owns the address."""
    p, echo = ip_proxy
    module_upstream.reset()
    s, head = connect_tunnel(p.port, f"127.0.0.1:{echo.port}")
    with s:
        assert head.startswith(b"HTTP/1.1 200"), head
        s.sendall(b"not TLS: the peek ends at once, echoed")
        assert s.recv(100) == b"not TLS: the peek ends at once, echoed"
    s, head = connect_tunnel(p.port, f"127.0.0.1:{module_upstream.port}")
    assert head.startswith(b"HTTP/1.1 200"), head
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with s, pytest.raises(OSError):
        with ctx.wrap_socket(s) as tls:  # no SNI
            tls.sendall(b"GET /x HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
            assert tls.recv(100) == b""
            raise OSError("closed")
    # Every paced name is mapped to the one upstream address; the line names the first one found.
    wait_for(lambda: "is an address of " in p.log(), 10, "the refusal line")
    line = next(x for x in p.log().splitlines() if "is an address of " in x)
    assert "commoncrawl.org" in line and "names no paced host" in line, line
    # A plain http:// request to the address data.commoncrawl.org:80 is mapped to: 403, naming the owner.
    r = requests.get(f"http://127.0.0.1:{module_upstream.plain_port}/x", proxies={"http": p.url}, timeout=20)
    assert r.status_code == 403 and "is an address of" in r.text and "use the name" in r.text, r.text
    assert module_upstream.log() == []
