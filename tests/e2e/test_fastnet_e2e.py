"""The optional [fast] extra end to end: a proxy on aiofastnet's transports serves intercepted requests,
bodies and blind tunnels like the default one. The rest of the suite runs the default transports
(tests/conftest.py sets POLITEPROXY_FASTNET=0, what a plain install gets), so this module is the extra's."""

from __future__ import annotations

import hashlib
import socket

import pytest
import requests

from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc
from tests.support.proxyio import CUT_CASES, bundle, connect_tunnel, proxies, start_with, still_serves
from tests.support.upstream_proc import Certs, Upstream

pytest.importorskip("aiofastnet")


@pytest.fixture(scope="module")
def fast(module_proxy_factory, module_upstream: Upstream, certs: Certs) -> ProxyProc:  # type: ignore[no-untyped-def]
    p = start_with(module_proxy_factory, module_upstream, certs, env={"POLITEPROXY_FASTNET": "1"})
    wait_for(lambda: "transports: aiofastnet" in p.log(), 10, "the aiofastnet start line")
    return p


def test_small_gets_and_a_body_go_through_aiofastnet(fast: ProxyProc) -> None:
    for _ in range(20):
        still_serves(fast)
    r = requests.get(
        "https://data.commoncrawl.org/size/4194304",
        proxies=proxies(fast),
        verify=str(bundle(fast)),
        timeout=60,
    )
    assert r.status_code == 200 and len(r.content) == 4 << 20
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(b"x" * (4 << 20)).digest()
    assert "1.1 politeproxy" in r.headers["Via"]


def test_a_blind_tunnel_and_its_close_on_aiofastnet(fast: ProxyProc) -> None:
    before = fast.metric("politeproxy_tunnels_open")
    s, head = connect_tunnel(fast.port, "other.example:443")
    assert head.startswith(b"HTTP/1.1 200"), head
    s.close()  # the client leaves during the peek: the tunnel's place comes back
    wait_for(lambda: fast.metric("politeproxy_tunnels_open") <= before, 15, "the tunnel closed")
    with socket.create_connection(("127.0.0.1", fast.port), timeout=10):
        pass
    still_serves(fast)
    assert "Traceback" not in fast.log()


@pytest.mark.parametrize(("path", "cut"), CUT_CASES)
def test_a_cut_upstream_body_is_a_cut_on_aiofastnet(fast: ProxyProc, path: str, cut: bool) -> None:
    """The lean upstream client tells a clean end of a close-delimited body from a cut by the transport's
    ``eof_received``; aiofastnet's TLS transport offers no readable TLS object to ask, so it must call it
    on a close_notify only. A cut reaches the client as a cut (requests raises), a clean end whole."""
    url = f"https://data.commoncrawl.org{path}"
    if cut:
        with pytest.raises(requests.exceptions.RequestException):
            requests.get(url, proxies=proxies(fast), verify=str(bundle(fast)), timeout=60).raise_for_status()
    else:
        r = requests.get(url, proxies=proxies(fast), verify=str(bundle(fast)), timeout=60)
        assert r.status_code == 200 and len(r.content) == 300000
