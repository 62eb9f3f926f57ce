"""No open proxy: loopback by default; any other listen address needs allow_clients or [auth] users."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from politeproxy.policy.access import Access, is_loopback
from tests.support.processes import POLITEPROXY, ROOT, free_port, need_tool, non_loopback_ip
from tests.support.proxyio import ProxyFactory, bundle, read_head, start_with
from tests.support.upstream_proc import Certs, Upstream

AUTH = '[auth]\nusers = { alice = "s3cret:with colon" }\n'


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("listen", ["0.0.0.0", "::", "192.0.2.77"])
def test_open_listen_address_without_rules_refuses_to_start(tmp_path: Path, listen: str) -> None:
    netloc = f"[{listen}]" if ":" in listen else listen
    r = subprocess.run(
        [*POLITEPROXY, "run", "--listen", f"{netloc}:{free_port()}", "--data-dir", str(tmp_path / "d")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("POLITEPROXY_")},
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "allow_clients" in lines[0] and "auth" in lines[0] and listen in lines[0]
    assert r.stdout == ""


def test_any_address_with_allow_clients_starts(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    port = free_port()
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        top='allow_clients = ["10.0.0.0/8"]\n',
        port=port,
        args=("--listen", f"0.0.0.0:{port}"),
    )
    r = requests.get(
        "https://data.commoncrawl.org/echo", proxies={"https": p.url}, verify=str(bundle(p)), timeout=30
    )
    assert r.status_code == 200  # loopback is always allowed
    assert "0.0.0.0" in p.log()


def test_proxy_authentication(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> None:
    port = free_port()
    p = start_with(proxy_factory, upstream, certs, top=AUTH, port=port, args=("--listen", f"0.0.0.0:{port}"))
    # CONNECT without credentials: 407 with a challenge, and no tunnel.
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        s.sendall(b"CONNECT data.commoncrawl.org:443 HTTP/1.1\r\nHost: data.commoncrawl.org:443\r\n\r\n")
        head = read_head(s)
    assert head.startswith(b"HTTP/1.1 407"), head
    assert b'Proxy-Authenticate: Basic realm="politeproxy"' in head
    # Wrong password, and a garbage header.
    for value in (basic("alice", "nope"), basic("bob", "s3cret:with colon"), "Basic !!!", "Bearer x"):
        with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
            s.sendall(
                b"CONNECT data.commoncrawl.org:443 HTTP/1.1\r\nHost: data.commoncrawl.org:443\r\n"
                + f"Proxy-Authorization: {value}\r\n\r\n".encode()
            )
            assert read_head(s).startswith(b"HTTP/1.1 407"), value
    # Plain http:// without and with credentials.
    r = requests.get("http://data.commoncrawl.org/echo", proxies={"http": p.url}, timeout=30)
    assert r.status_code == 407
    assert r.headers["Proxy-Authenticate"] == 'Basic realm="politeproxy"'
    auth_url = f"http://alice:{requests.utils.quote('s3cret:with colon', safe='')}@127.0.0.1:{p.port}"
    r = requests.get("http://data.commoncrawl.org/echo?auth=1", proxies={"http": auth_url}, timeout=30)
    assert r.status_code == 200, r.text
    sent = {k.lower() for k, _ in r.json()["headers"]}
    assert "proxy-authorization" not in sent  # credentials for the proxy never travel upstream
    # HTTPS through CONNECT with credentials (requests).
    r = requests.get(
        "https://data.commoncrawl.org/echo?auth=2",
        proxies={"https": auth_url},
        verify=str(bundle(p)),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert "proxy-authorization" not in {k.lower() for k, _ in r.json()["headers"]}
    # curl --proxy-user
    curl = need_tool("curl")
    env = {k: v for k, v in p.env.items()}
    base = [curl, "-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"]
    ok = subprocess.run(
        [*base, "--proxy-user", "alice:s3cret:with colon", "https://data.commoncrawl.org/echo?curl=1"],
        env=env,
        capture_output=True,
        text=True,
    )
    body, _, code = ok.stdout.rpartition("\n")
    assert ok.returncode == 0 and code == "200", ok.stderr
    assert json.loads(body)["path"] == "/echo?curl=1"
    bad = subprocess.run(
        [*base, "https://data.commoncrawl.org/echo?curl=2"], env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 or bad.stdout.endswith("407"), bad.stdout + bad.stderr
    assert "407" in bad.stderr + bad.stdout
    assert [a["path"] for a in upstream.log()] == ["/echo?auth=1", "/echo?auth=2", "/echo?curl=1"]


def test_client_outside_allow_clients_gets_403(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    port = free_port()
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        top='allow_clients = ["198.51.100.0/24"]\n',
        port=port,
        args=("--listen", f"0.0.0.0:{port}"),
    )
    with socket.create_connection((ip, p.port), timeout=30, source_address=(ip, 0)) as s:
        s.sendall(b"GET http://data.commoncrawl.org/echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        head = read_head(s)
    assert head.startswith(b"HTTP/1.1 403"), head
    assert upstream.log() == []
    assert f"{ip}: 403" in p.log()


def test_access_rules() -> None:
    a = Access(["10.0.0.0/8", "2001:db8::/32"], {})
    assert a.open_beyond_loopback
    assert a.ip_allowed("127.0.0.1") and a.ip_allowed("::1")
    assert a.ip_allowed("10.1.2.3") and a.ip_allowed("2001:db8::5")
    assert not a.ip_allowed("192.168.1.1")
    assert not a.ip_allowed("11.0.0.1")
    assert not a.ip_allowed("2001:db9::1")
    assert not a.ip_allowed("not an ip")
    assert a.auth_ok(None)  # no users: no authentication
    loop_only = Access([], {})
    assert not loop_only.open_beyond_loopback
    assert loop_only.ip_allowed("127.0.0.5")
    assert not loop_only.ip_allowed("10.0.0.1")
    users = Access([], {"alice": "pw"})
    assert users.ip_allowed("203.0.113.9")  # anyone may try, with credentials
    assert users.auth_ok(basic("alice", "pw"))
    assert users.auth_ok("basic " + basic("alice", "pw")[6:])
    assert not users.auth_ok(basic("alice", "PW"))
    assert not users.auth_ok(basic("mallory", "pw"))
    assert not users.auth_ok(None)
    assert not users.auth_ok("Basic %%%")
    assert not users.auth_ok("Basic " + base64.b64encode(b"\xff\xfe:x").decode())
    both = Access(["10.0.0.0/8"], {"alice": "pw"})
    assert both.ip_allowed("10.9.9.9") and not both.ip_allowed("192.0.2.1")


def test_ipv4_mapped_ipv6_clients_match_ipv4_rules() -> None:
    """A dual-stack listener on :: reports IPv4 clients as ::ffff:a.b.c.d: the IPv4 rules apply."""
    a = Access(["10.0.0.0/8"], {})
    assert a.ip_allowed("::ffff:10.1.2.3")
    assert a.ip_allowed("::FFFF:10.255.0.1")
    assert not a.ip_allowed("::ffff:11.1.2.3")
    assert not a.ip_allowed("::ffff:192.0.2.1")
    loop_only = Access([], {})
    assert loop_only.ip_allowed("::ffff:127.0.0.1")  # mapped loopback is loopback
    assert not loop_only.ip_allowed("::ffff:10.1.2.3")
    assert is_loopback("::ffff:127.0.0.9") and not is_loopback("::ffff:10.0.0.1")
    v6 = Access(["::ffff:0:0/96"], {})  # a rule written in the mapped form still matches nothing else
    assert not v6.ip_allowed("2001:db8::1")


def test_admin_paths_need_the_password_when_only_auth_admits_a_client(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    """With only ``[auth] users``, any address may connect (to authenticate); the admin paths take no
    password of their own, so such a client must send Proxy-Authorization to read them (407 without)."""
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    port = free_port()
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        top='[auth]\nusers = { alice = "s3cret" }\n',
        port=port,
        args=("--listen", f"0.0.0.0:{port}"),
    )
    for path in ("/metrics", "/healthz", "/ca.pem"):
        for header, want in (
            ("", b"HTTP/1.1 407"),
            (f"Proxy-Authorization: {basic('alice', 's3cret')}\r\n", b"HTTP/1.1 200"),
        ):
            with socket.create_connection((ip, p.port), timeout=30, source_address=(ip, 0)) as s:
                # The Host names the address asked (issue 25: any other name gets 421, a rebinding guard).
                req = f"GET {path} HTTP/1.1\r\nHost: {ip}:{p.port}\r\n{header}Connection: close\r\n\r\n"
                s.sendall(req.encode())
                head = read_head(s)
            assert head.startswith(want), (path, header, head)
    assert p.healthy()  # loopback needs no password


def test_admin_allowed_rules() -> None:
    a = Access([], {"alice": "s3cret"})
    assert a.admin_allowed("127.0.0.1", None)
    assert not a.admin_allowed("192.0.2.9", None)
    assert a.admin_allowed("192.0.2.9", basic("alice", "s3cret"))
    assert not a.admin_allowed("192.0.2.9", basic("alice", "wrong"))
    b = Access(["192.0.2.0/24"], {})
    assert b.admin_allowed("192.0.2.9", None) and not b.admin_allowed("198.51.100.1", None)
