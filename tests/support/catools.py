"""What the CA hardening tests share: a CA in a directory, a leaf signed by hand, one-connection TLS servers
and clients on 127.0.0.1, and `openssl verify`.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from politeproxy.policy.hosts import HostSet
from politeproxy.proxy.door.ca import CertificateAuthority
from tests.support.processes import need_tool

PERMITTED = HostSet().permitted_subtrees()

CONFIGURED = HostSet().concrete_hosts()


def new_ca(d: Path, **kw: object) -> CertificateAuthority:
    return CertificateAuthority(d, PERMITTED, **kw)  # type: ignore[arg-type]


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def sign(
    d: Path, sans: list[x509.GeneralName], subject: x509.Name | None = None
) -> tuple[Path, Path, ec.EllipticCurvePrivateKey]:
    """A leaf with ``sans`` signed with the CA key in ``d``, as an attacker holding the key would."""
    ca_cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca-key.pem").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leaf")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    n = len(list(d.parent.glob("leaf*.pem")))
    cert_path, key_path = d.parent / f"leaf{n}.pem", d.parent / f"leaf{n}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(pem_key(key))
    return cert_path, key_path, key


@contextmanager
def tls_server(ctx: ssl.SSLContext) -> Iterator[int]:
    """A TLS server on 127.0.0.1 that serves one connection: a handshake, a short answer, close."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(10)

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.settimeout(10)
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        except (ssl.SSLError, OSError):
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        t.join(10)
        srv.close()


def leaf_server(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_handshake(port: int, server_hostname: str, cafile: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname),
    ):
        pass


def openssl_verify(ca: Path, leaf: Path) -> subprocess.CompletedProcess[str]:
    openssl = need_tool("openssl")
    cmd = [openssl, "verify", "-CAfile", str(ca), "-purpose", "sslserver", str(leaf)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
