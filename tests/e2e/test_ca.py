"""The local CA: its files, its name constraints (checked by OpenSSL), and regeneration."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import certifi
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from politeproxy.policy.hosts import DEFAULT_PACED_HOSTS
from politeproxy.proxy.door.ca import sign_leaf
from tests.support.processes import POLITEPROXY, ROOT, need_tool
from tests.support.proxy_proc import FAST
from tests.support.proxyio import ProxyFactory, exchange, tls_through_proxy, upstream_toml
from tests.support.upstream_proc import Certs, Upstream


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*POLITEPROXY, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def make_ca(data_dir: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = ["ca", "--data-dir", str(data_dir)]
    if config is not None:
        args += ["--config", str(config)]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return r


def load_ca(data_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((data_dir / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((data_dir / "ca-key.pem").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def write_leaf(tmp: Path, host: str, data_dir: Path) -> tuple[Path, Path]:
    """A leaf for ``host`` signed with the proxy's CA key, as an attacker holding the key would."""
    ca_cert, ca_key = load_ca(data_dir)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = sign_leaf(host, ca_cert, ca_key, leaf_key)
    cert_path, key_path = tmp / f"{host}.pem", tmp / f"{host}-key.pem"
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def python_handshake(cert: Path, key: Path, host: str, cafile: Path) -> None:
    """A TLS handshake between Python's ssl (OpenSSL) server and client over a socketpair."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=host):
            pass
    finally:
        b.close()
        t.join(10)
        a.close()


def test_ca_files(tmp_path: Path) -> None:
    d = tmp_path / "data"
    out = make_ca(d).stdout
    for name in ("ca.pem", "ca-key.pem", "ca-bundle.pem"):
        assert (d / name).is_file()
        assert str(d / name) in out
    assert stat.S_IMODE((d / "ca-key.pem").stat().st_mode) == 0o600
    ca = (d / "ca.pem").read_bytes()
    bundle = (d / "ca-bundle.pem").read_bytes()
    roots = Path(certifi.where()).read_bytes()
    assert ca.strip() in bundle
    want = roots.count(b"-----BEGIN CERTIFICATE-----") + 1
    assert bundle.count(b"-----BEGIN CERTIFICATE-----") == want
    # Every certifi root is in the bundle, byte for byte.
    for block in roots.split(b"-----END CERTIFICATE-----")[:-1]:
        pem = block[block.index(b"-----BEGIN CERTIFICATE-----") :]
        assert pem in bundle
    # The bundle loads as a trust store.
    ctx = ssl.create_default_context(cafile=str(d / "ca-bundle.pem"))
    assert ctx.cert_store_stats()["x509_ca"] == want
    # A second run keeps the CA.
    make_ca(d)
    assert (d / "ca.pem").read_bytes() == ca


def test_ca_name_constraints_are_critical_and_permit_only_paced_domains(tmp_path: Path) -> None:
    d = tmp_path / "data"
    make_ca(d)
    cert, _ = load_ca(d)
    ext = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert ext.critical
    subtrees = ext.value.permitted_subtrees or []
    permitted = sorted(g.value for g in subtrees if isinstance(g, x509.DNSName))
    # Other name types are permitted only under the reserved "invalid" domain, i.e. never.
    assert {g.value for g in subtrees if not isinstance(g, x509.DNSName)} == {"invalid"}
    assert "commoncrawl.org" in permitted
    assert "commoncrawl.s3.amazonaws.com" in permitted
    assert "commoncrawl.s3.us-east-1.amazonaws.com" in permitted
    assert all("commoncrawl" in p for p in permitted), permitted
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0


@pytest.mark.parametrize("host", ["example.com", "commoncrawl.org.evil.example", "notcommoncrawl.org"])
def test_openssl_rejects_a_leaf_outside_the_constraints(tmp_path: Path, host: str) -> None:
    openssl = need_tool("openssl")
    d = tmp_path / "data"
    make_ca(d)
    ca = d / "ca.pem"
    bad, bad_key = write_leaf(tmp_path, host, d)
    r = subprocess.run(
        [openssl, "verify", "-CAfile", str(ca), "-purpose", "sslserver", str(bad)],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0, r.stdout
    assert "subtree violation" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree"):
        python_handshake(bad, bad_key, host, ca)


def test_openssl_accepts_a_leaf_inside_the_constraints(tmp_path: Path) -> None:
    openssl = need_tool("openssl")
    d = tmp_path / "data"
    make_ca(d)
    ca = d / "ca.pem"
    for host in ("data.commoncrawl.org", "commoncrawl.org", "commoncrawl.s3.amazonaws.com"):
        good, good_key = write_leaf(tmp_path, host, d)
        r = subprocess.run(
            [openssl, "verify", "-CAfile", str(ca), "-purpose", "sslserver", str(good)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        python_handshake(good, good_key, host, ca)


def test_proxy_leaves_verify_with_openssl(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    """The leaves the proxy itself made at start-up pass `openssl verify` against ca.pem."""
    openssl = need_tool("openssl")
    p = proxy_factory(None, FAST + upstream_toml(upstream, certs))
    leaves = sorted((p.data_dir / "leaves").glob("*.pem"))
    assert {x.stem for x in leaves} >= {"data.commoncrawl.org", "index.commoncrawl.org", "commoncrawl.org"}
    for leaf in leaves:
        r = subprocess.run(
            [openssl, "verify", "-CAfile", str(p.data_dir / "ca.pem"), "-purpose", "sslserver", str(leaf)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # a CA made, then a proxy that remakes it: ~3 s
def test_ca_is_remade_when_paced_hosts_outgrow_it(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, tmp_path: Path
) -> None:
    d = tmp_path / "data"
    make_ca(d)
    old = (d / "ca.pem").read_bytes()
    hosts = ", ".join(f'"{h}"' for h in (*DEFAULT_PACED_HOSTS, "other.example"))
    extra = f"paced_hosts = [{hosts}]\n" + FAST
    # paced_hosts is a top-level key: it must come before any table.
    p = proxy_factory(None, upstream_toml(upstream, certs), top_toml=extra, data_dir=d)
    log = p.log()
    assert "MAKING A NEW CA" in log, log
    assert "other.example" in log
    new = (d / "ca.pem").read_bytes()
    assert new != old
    cert, _ = load_ca(d)
    nc = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert "other.example" in [g.value for g in nc.permitted_subtrees or []]
    # other.example is now intercepted with a leaf from the new CA.
    with tls_through_proxy(p.port, "other.example", d / "ca.pem") as s:
        resp = exchange(s, b"GET /echo HTTP/1.1\r\nHost: other.example\r\n\r\n")
        assert resp.status == 200
    # The bundle names the new CA, and the leaves were made by it.
    assert new.strip() in (d / "ca-bundle.pem").read_bytes()
    r = requests.get(
        "https://data.commoncrawl.org/echo",
        proxies={"https": p.url},
        verify=str(d / "ca-bundle.pem"),
        timeout=30,
    )
    assert r.status_code == 200
    p.stop()
    # A restart with the same hosts keeps the new CA and says nothing loud.
    p2 = proxy_factory(None, upstream_toml(upstream, certs), top_toml=extra, data_dir=d)
    assert (d / "ca.pem").read_bytes() == new
    assert "MAKING A NEW CA" not in p2.log()
