"""Issue 9, the CA's constraints (10): no leaf for an IP, an e-mail or a URI verifies (`openssl verify`,
curl, real handshakes), a proper leaf and a long name still do, and a CA from before the exclusions is
replaced loudly (kept, with a warning, by the helper commands).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from politeproxy.policy.hosts import valid_hostname
from politeproxy.proxy.door.ca import constraints_current
from tests.support.catools import (
    PERMITTED,
    client_handshake,
    leaf_server,
    new_ca,
    openssl_verify,
    pem_key,
    sign,
    tls_server,
)
from tests.support.processes import need_tool
from tests.support.proxy_proc import FAST
from tests.support.proxyio import ProxyFactory, tls_through_proxy, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

IP = x509.IPAddress

DATA = x509.DNSName("data.commoncrawl.org")

BAD_LEAVES = {
    "ip-127.0.0.1": ([IP(ipaddress.ip_address("127.0.0.1"))], "127.0.0.1", None),
    "ip-10.0.0.1": ([IP(ipaddress.ip_address("10.0.0.1"))], "10.0.0.1", None),
    "ip-::1": ([IP(ipaddress.ip_address("::1"))], "::1", None),
    "ip-169.254.169.254": ([IP(ipaddress.ip_address("169.254.169.254"))], "169.254.169.254", None),
    "email-san": ([DATA, x509.RFC822Name("admin@example.com")], "data.commoncrawl.org", None),
    "email-san-paced-domain": ([DATA, x509.RFC822Name("a@commoncrawl.org")], "data.commoncrawl.org", None),
    "uri-san": ([DATA, x509.UniformResourceIdentifier("https://example.com/")], "data.commoncrawl.org", None),
    "email-in-subject": (
        [DATA],
        "data.commoncrawl.org",
        x509.Name([x509.NameAttribute(NameOID.EMAIL_ADDRESS, "admin@example.com")]),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LEAVES))
def test_a_leaf_for_an_ip_email_or_uri_is_rejected(tmp_path: Path, case: str) -> None:
    d = tmp_path / "data"
    new_ca(d)
    sans, hostname, subject = BAD_LEAVES[case]
    cert, key, _ = sign(d, sans, subject)
    r = openssl_verify(d / "ca.pem", cert)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "subtree violation" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    with (
        tls_server(leaf_server(cert, key)) as port,
        pytest.raises(ssl.SSLCertVerificationError, match="subtree"),
    ):
        client_handshake(port, hostname, d / "ca.pem")


@pytest.mark.parametrize("ip", ["127.0.0.1", "10.0.0.1"])
def test_curl_rejects_an_ip_leaf(tmp_path: Path, ip: str) -> None:
    curl = need_tool("curl")
    d = tmp_path / "data"
    new_ca(d)
    cert, key, _ = sign(d, [IP(ipaddress.ip_address(ip))])
    with tls_server(leaf_server(cert, key)) as port:
        # --connect-to reaches our server while curl checks the certificate against ``ip``.
        cmd = [curl, "-sS", "--cacert", str(d / "ca.pem"), "--connect-to", f"{ip}:443:127.0.0.1:{port}"]
        r = subprocess.run([*cmd, f"https://{ip}/"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 60, (r.returncode, r.stderr)  # 60: peer certificate cannot be authenticated


def test_a_proper_leaf_still_verifies(tmp_path: Path) -> None:
    d = tmp_path / "data"
    new_ca(d)
    cert, key, _ = sign(
        d, [DATA], x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "data.commoncrawl.org")])
    )
    r = openssl_verify(d / "ca.pem", cert)
    assert r.returncode == 0, r.stdout + r.stderr
    with tls_server(leaf_server(cert, key)) as port:
        client_handshake(port, "data.commoncrawl.org", d / "ca.pem")
    # The proxy's own leaf too.
    leaf = d / "leaves" / "data.commoncrawl.org.pem"
    new_ca(d).context_for("data.commoncrawl.org")
    assert openssl_verify(d / "ca.pem", leaf).returncode == 0


def write_old_ca(d: Path) -> bytes:
    """A CA as versions before issue 9 made it: DNS names permitted, nothing excluded."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "politeproxy local CA old")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    nc = x509.NameConstraints(permitted_subtrees=[x509.DNSName(n) for n in PERMITTED], excluded_subtrees=None)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(nc, critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    d.mkdir(parents=True)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (d / "ca.pem").write_bytes(pem)
    (d / "ca-key.pem").write_bytes(pem_key(key))
    (d / "ca-key.pem").chmod(0o600)
    return pem


def test_an_old_ca_without_exclusions_is_replaced_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "data"
    old = write_old_ca(d)
    # The old CA really was the hole: an IP leaf signed with its key verifies.
    cert, _, _ = sign(d, [IP(ipaddress.ip_address("127.0.0.1"))])
    assert openssl_verify(d / "ca.pem", cert).returncode == 0
    with caplog.at_level(logging.WARNING, "politeproxy.proxy.ca"):
        ca = new_ca(d)
    assert "MAKING A NEW CA" in caplog.text and "exclude IP" in caplog.text, caplog.text
    assert ca.created and (d / "ca.pem").read_bytes() != old
    assert constraints_current(ca.cert)
    cert, _, _ = sign(d, [IP(ipaddress.ip_address("127.0.0.1"))])
    assert openssl_verify(d / "ca.pem", cert).returncode != 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, "politeproxy.proxy.ca"):
        new_ca(d)  # the new one is kept without a word
    assert "MAKING A NEW CA" not in caplog.text


def test_helper_commands_keep_an_old_ca_but_say_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "data"
    old = write_old_ca(d)
    with caplog.at_level(logging.WARNING, "politeproxy.proxy.ca"):
        ca = new_ca(d, remake=False)
    assert (d / "ca.pem").read_bytes() == old and not ca.created
    assert "outdated" in caplog.text and "MAKING A NEW CA" not in caplog.text


def test_proxy_replaces_an_old_ca_loudly(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, tmp_path: Path
) -> None:
    d = tmp_path / "olddata"
    old = write_old_ca(d)
    p = proxy_factory(None, FAST + upstream_toml(upstream, certs), data_dir=d)
    assert "MAKING A NEW CA" in p.log(), p.log()
    assert (d / "ca.pem").read_bytes() != old
    with tls_through_proxy(p.port, "data.commoncrawl.org", d / "ca.pem"):
        pass


def test_a_name_longer_than_a_common_name_still_gets_a_verified_leaf(tmp_path: Path) -> None:
    """A CN holds 64 characters; a valid 100-character name is served with the name in the SAN only."""
    d = tmp_path / "data"
    ca = new_ca(d)
    host = ("a" * 40 + ".") * 2 + "data.commoncrawl.org"
    assert valid_hostname(host) and len(host) > 64
    with tls_server(ca.context_for(host)) as port:
        client_handshake(port, host, d / "ca.pem")
    r = openssl_verify(d / "ca.pem", d / "leaves" / f"{host}.pem")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_remake_reason_names_four_missing_names_and_a_count() -> None:
    """A CA made before the S3 endpoint forms lacks ~150 names: the warning stays one readable line."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from politeproxy.proxy.door.ca import CertificateAuthority

    missing = [f"commoncrawl.s3-r{i}.amazonaws.com" for i in range(150)]
    why = CertificateAuthority._why_remake(None, ec.generate_private_key(ec.SECP256R1()), missing)  # type: ignore[arg-type]
    assert why is not None and "146 more" in why and "s3-r3." in why and "s3-r4." not in why
    assert len(why) < 300, why
