"""The local CA and its leaves (cryptography).

The CA carries critical NameConstraints permitting only the paced domains, so a leaked key cannot
impersonate any other site. One EC key serves every leaf, so a new leaf costs one signature.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import threading
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from politeproxy.policy.hosts import is_covered

log = logging.getLogger("politeproxy.proxy.ca")


class CAError(Exception):
    """The CA in the data dir cannot be read, parsed or written; the message is one line for the user."""


CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=397)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_usage(signs_certs: bool) -> x509.KeyUsage:
    """Signatures only; a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certs,
        crl_sign=signs_certs,
        encipher_only=False,
        decipher_only=False,
    )


def permitted_names(cert: x509.Certificate) -> list[str]:
    try:
        nc = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return []
    return [g.value for g in nc.permitted_subtrees or [] if isinstance(g, x509.DNSName)]


def make_ca(permitted: list[str]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "politeproxy"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"politeproxy local CA {now:%Y-%m-%d %H:%M:%S}"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certs=True),
            critical=True,
        )
        .add_extension(
            x509.NameConstraints(
                permitted_subtrees=[x509.DNSName(n) for n in permitted], excluded_subtrees=None
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def sign_leaf(
    host: str,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    leaf_key: ec.EllipticCurvePrivateKey,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(min(now + LEAF_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            _key_usage(signs_certs=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


class CertificateAuthority:
    """The CA in ``data_dir``; made on first run, remade when the paced host set outgrows it."""

    def __init__(self, data_dir: Path, permitted: list[str], remake: bool = True) -> None:
        """``remake=False`` (``politeproxy env``/``ca``) never replaces an existing CA: only ``run`` may,
        or a helper command run without the proxy's config would swap the CA under a running proxy."""
        self.dir = Path(data_dir)
        self.remake = remake
        self.missing: list[str] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert_path = self.dir / "ca.pem"
        self.key_path = self.dir / "ca-key.pem"
        self.bundle_path = self.dir / "ca-bundle.pem"
        self.leaf_key_path = self.dir / "leaf-key.pem"
        self.leaf_dir = self.dir / "leaves"
        self.created = False
        self._load_or_make(permitted)
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def _load_or_make(self, permitted: list[str]) -> None:
        if self.cert_path.exists() and self.key_path.exists():
            cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
            have = permitted_names(cert)
            missing = [n for n in permitted if not is_covered(n, have)]
            expired = cert.not_valid_after_utc < dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
            usable = isinstance(key, ec.EllipticCurvePrivateKey)
            if usable and (not self.remake or (not missing and not expired)):
                self.cert, self.key = cert, key  # type: ignore[assignment]
                self.missing = missing
                self._load_leaf_key()
                self._write_bundle()
                return
            why = (
                "its key is not an EC key"
                if not usable
                else f"its name constraints lack {', '.join(missing)}"
                if missing
                else "it expires soon"
            )
            log.warning(
                "!!! MAKING A NEW CA in %s because %s; tools that trusted the old ca.pem must trust the new "
                "one (run `politeproxy env` again) !!!",
                self.dir,
                why,
            )
        self.cert, self.key = make_ca(permitted)
        _write_private(self.key_path, _pem_key(self.key))
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        if self.leaf_dir.exists():
            for p in self.leaf_dir.glob("*.pem"):
                p.unlink()
        self.created = True
        self._load_leaf_key()
        self._write_bundle()

    def _load_leaf_key(self) -> None:
        if self.leaf_key_path.exists():
            key = serialization.load_pem_private_key(self.leaf_key_path.read_bytes(), password=None)
            if isinstance(key, ec.EllipticCurvePrivateKey):
                self.leaf_key = key
                return
        self.leaf_key = ec.generate_private_key(ec.SECP256R1())
        _write_private(self.leaf_key_path, _pem_key(self.leaf_key))

    def _write_bundle(self) -> None:
        roots = Path(certifi.where()).read_bytes()
        data = (
            roots.rstrip(b"\n")
            + b"\n\n# politeproxy local CA\n"
            + self.cert.public_bytes(serialization.Encoding.PEM)
        )
        tmp = self.bundle_path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.bundle_path)

    @property
    def permitted(self) -> list[str]:
        return permitted_names(self.cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server-side SSLContext presenting a leaf for ``host``; made once, then cached."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            return ctx
        with self._lock:
            ctx = self._contexts.get(host)
            if ctx is None:
                ctx = self._make_context(host)
                self._contexts[host] = ctx
        return ctx

    def _make_context(self, host: str) -> ssl.SSLContext:
        self.leaf_dir.mkdir(exist_ok=True)
        path = self.leaf_dir / f"{host}.pem"
        leaf = sign_leaf(host, self.cert, self.key, self.leaf_key)
        path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + self.pem())
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        ctx.load_cert_chain(path, self.leaf_key_path)
        return ctx
