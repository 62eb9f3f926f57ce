"""The local CA and its leaves (cryptography). Critical NameConstraints permit DNS names under the paced
domains only, no IP address, and e-mail/URI names under the reserved ``invalid`` only: a leaked key cannot
impersonate anything else. One EC key serves every leaf, so a new leaf costs one signature."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from politeproxy.policy.hosts import is_covered, normalize_host, valid_hostname

log = logging.getLogger("politeproxy.proxy.ca")  # the name from before proxy/door/: log configs read it
Key = ec.EllipticCurvePrivateKey


class CAError(Exception):
    """The CA in the data dir cannot be read, parsed or written; the message is one line for the user."""


class NameRefused(CAError, ValueError):
    """A leaf was asked for a name that is not a host name, or that the CA's constraints do not permit."""


CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=397)
MAX_CONTEXTS = 256  # unpinned contexts (any covered name a client asks for); least recently used go first
MAX_PINNED = 64  # pinned contexts: the configured concrete hosts, whose leaves are kept in leaves/

# RFC 2606 reserves "invalid": permitting only it for e-mail and URI names rejects every real one, since
# excluded subtrees have no "every address" form that OpenSSL honours. directoryName is not constrained:
# Go's crypto/x509 treats a critical NameConstraints with one as unhandled and would reject every leaf.
NO_MAIL, NO_URI = x509.RFC822Name("invalid"), x509.UniformResourceIdentifier("invalid")
ALL_IPS = tuple(x509.IPAddress(ipaddress.ip_network(n)) for n in ("0.0.0.0/0", "::/0"))


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Unique temp file in the same dir, then rename: others see the old file or the new, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # already gone unless something failed


@contextlib.contextmanager
def _dir_lock(d: Path) -> Iterator[None]:
    """Two proxies starting on one data dir must not both make a CA: wait 10 s at most, else go on."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # no lock file (read-only dir) or no locks (some NFS): go on
            f = stack.enter_context(open(d / ".ca.lock", "ab"))
            for _ in range(200):
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                time.sleep(0.05)
        yield  # closing the file releases the lock


def _pem_key(key: Key) -> bytes:
    pkcs8, plain = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, plain)


def _key_usage(signs_certs: bool) -> x509.KeyUsage:
    """Signatures only; a CA also signs certificates and CRLs."""
    # digital_signature, content_commitment, key/data encipherment, key_agreement, cert and CRL signing
    return x509.KeyUsage(True, False, False, False, False, signs_certs, signs_certs, False, False)


def _constraints(cert: x509.Certificate) -> x509.NameConstraints | None:
    found = [e.value for e in cert.extensions if isinstance(e.value, x509.NameConstraints)]
    return found[0] if found else None


def permitted_names(cert: x509.Certificate) -> list[str]:
    nc = _constraints(cert)
    return [g.value for g in (nc and nc.permitted_subtrees) or [] if isinstance(g, x509.DNSName)]


def name_constraints(permitted: list[str]) -> x509.NameConstraints:
    return x509.NameConstraints([*map(x509.DNSName, permitted), NO_MAIL, NO_URI], list(ALL_IPS))


def constraints_current(cert: x509.Certificate) -> bool:
    """False for a CA made before the IP, e-mail and URI exclusions: it is replaced."""
    nc = _constraints(cert)
    others = {repr(g) for g in (nc and nc.permitted_subtrees) or [] if not isinstance(g, x509.DNSName)}
    excluded = (nc and nc.excluded_subtrees) or []
    return others == {repr(NO_MAIL), repr(NO_URI)} and all(ip in excluded for ip in ALL_IPS)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, until: dt.datetime
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(min(until, now + CA_VALIDITY))
    )


def make_ca(permitted: list[str]) -> tuple[x509.Certificate, Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cn = x509.NameAttribute(NameOID.COMMON_NAME, f"politeproxy local CA {now:%Y-%m-%d %H:%M:%S}")
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "politeproxy"), cn])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(name, name, key.public_key(), now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certs=True), critical=True)
        .add_extension(name_constraints(permitted), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def sign_leaf(host: str, ca_cert: x509.Certificate, ca_key: Key, leaf_key: Key) -> x509.Certificate:
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    # A CN holds 64 characters at most; longer names go in the SAN alone, which must then be critical.
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)] if len(host) <= 64 else [])
    until = min(dt.datetime.now(dt.UTC) + LEAF_VALIDITY, ca_cert.not_valid_after_utc)
    return (
        _builder(subject, ca_cert.subject, leaf_key.public_key(), until)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=len(host) > 64)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_key_usage(signs_certs=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


_REMEDY = "move ca.pem and ca-key.pem away to make a new CA (tools must then trust the new ca.pem)"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CAError(f"cannot read {path}: {e.strerror}; fix its permissions or {_REMEDY}") from None


def _make_private(path: Path) -> None:
    """A key readable by others is made 0600, loudly; one that cannot be fixed is refused."""
    if not (mode := path.stat().st_mode & 0o777) & 0o077:
        return
    try:
        os.chmod(path, 0o600)
    except OSError as e:
        why = f"{path} is readable by others (mode {mode:o}) and chmod 600 failed ({e.strerror})"
        raise CAError(f"{why}; chmod 600 it as its owner") from None
    msg = "!!! %s WAS READABLE BY OTHERS (mode %o); made it 0600. Whoever read it can impersonate the paced"
    log.warning(msg + " hosts to tools that trust ca.pem: if that worries you, %s !!!", path, mode, _REMEDY)


def load_pair(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, object]:
    """The CA certificate and its key, or CAError naming the file that is wrong."""
    try:
        cert = x509.load_pem_x509_certificate(_read(cert_path))
    except ValueError:
        raise CAError(f"{cert_path} is not a PEM certificate; restore it or {_REMEDY}") from None
    try:
        key = serialization.load_pem_private_key(_read(key_path), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise CAError(f"{key_path} is not an unencrypted PEM private key; restore it or {_REMEDY}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise CAError(f"{key_path} is not the key of {cert_path}; restore the pair or {_REMEDY}")
    return cert, key


class CertificateAuthority:
    """The CA in ``data_dir``; made on first run, remade (loudly) when the paced hosts outgrow it or it
    lacks today's exclusions. ``await ca.context(host)`` serves clients (bounded LRU, nothing on disk);
    ``ca.context_for(host)`` is the blocking form that pins configured hosts and keeps their leaves."""

    def __init__(
        self, data_dir: Path, permitted: list[str], remake: bool = True, max_contexts: int = MAX_CONTEXTS
    ) -> None:
        """``remake=False`` (``politeproxy env``/``ca``) never replaces an existing CA: only ``run`` may,
        or a helper command run without the proxy's config would swap the CA under a running proxy."""
        self.dir, self.remake, self.max_contexts = Path(data_dir), remake, max_contexts
        self.missing: list[str] = []
        self.cert_path, self.key_path = self.dir / "ca.pem", self.dir / "ca-key.pem"
        self.bundle_path, self.leaf_key_path = self.dir / "ca-bundle.pem", self.dir / "leaf-key.pem"
        self.leaf_dir = self.dir / "leaves"
        self.created = False
        self._pinned: dict[str, ssl.SSLContext] = {}
        self._lru: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        # _cache_lock guards dict operations only; _make_lock lets one signer work, so one name, one leaf
        self._cache_lock, self._make_lock = threading.Lock(), threading.Lock()
        self._inflight: dict[str, asyncio.Future[ssl.SSLContext]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="politeproxy-ca")  # threads on use
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with _dir_lock(self.dir):
                self._load_or_make(permitted)
                self._load_leaf_key()
                self._write_bundle()
        except OSError as e:
            why = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
            raise CAError(f"cannot write the CA in {self.dir} ({why}); make data_dir writable") from None
        self._permitted = permitted_names(self.cert)

    def _load_or_make(self, permitted: list[str]) -> None:
        have_cert, have_key = self.cert_path.exists(), self.key_path.exists()
        if have_cert != have_key:
            there, gone = (self.cert_path, self.key_path) if have_cert else (self.key_path, self.cert_path)
            raise CAError(f"{there} exists but {gone} does not; restore {gone.name} or {_REMEDY}")
        if have_cert:
            _make_private(self.key_path)
            cert, key = load_pair(self.cert_path, self.key_path)
            missing = [n for n in permitted if not is_covered(n, permitted_names(cert))]
            why = self._why_remake(cert, key, missing)
            if isinstance(key, Key) and (why is None or not self.remake):  # why is None: an EC key, current
                self.cert, self.key, self.missing = cert, key, missing
                if why is not None and not missing:
                    log.warning("the CA in %s is outdated (%s); `politeproxy run` replaces it", self.dir, why)
                return
            msg = "!!! MAKING A NEW CA in %s because %s; tools that trusted the old ca.pem must trust"
            log.warning(msg + " the new one (run `politeproxy env` again) !!!", self.dir, why)
        self.cert, self.key = make_ca(permitted)
        _atomic_write(self.key_path, _pem_key(self.key), 0o600)
        _atomic_write(self.cert_path, self.pem(), 0o644)
        for p in self.leaf_dir.glob("*.pem") if self.leaf_dir.exists() else ():
            p.unlink(missing_ok=True)
        self.created = True

    @staticmethod
    def _why_remake(cert: x509.Certificate, key: object, missing: list[str]) -> str | None:
        if not isinstance(key, Key):
            return "its key is not an EC key"
        if missing:
            more = f" and {len(missing) - 4} more (`politeproxy ca --all`)" if len(missing) > 4 else ""
            return f"its name constraints lack {', '.join(missing[:4])}{more}"
        if not constraints_current(cert):
            return "its name constraints do not exclude IP addresses, e-mail and URI names (an older CA)"
        if cert.not_valid_after_utc < dt.datetime.now(dt.UTC) + dt.timedelta(days=30):
            return "it expires soon"
        return None

    def _load_leaf_key(self) -> None:
        """The one leaf key; a broken one is only replaced (it signs nothing, leaves are remade)."""
        key: object = None
        if self.leaf_key_path.exists():
            _make_private(self.leaf_key_path)
            with contextlib.suppress(ValueError, TypeError, UnsupportedAlgorithm):
                key = serialization.load_pem_private_key(_read(self.leaf_key_path), password=None)
            if not isinstance(key, Key):
                log.warning("%s is not an EC private key; making a new leaf key", self.leaf_key_path)
        if not isinstance(key, Key):
            key = ec.generate_private_key(ec.SECP256R1())
            _atomic_write(self.leaf_key_path, _pem_key(key), 0o600)
        self.leaf_key, self._leaf_key_pem = key, _pem_key(key)

    def _write_bundle(self) -> None:
        roots = Path(certifi.where()).read_bytes()
        data = roots.rstrip(b"\n") + b"\n\n# politeproxy local CA\n" + self.pem()
        with contextlib.suppress(OSError):
            if self.bundle_path.read_bytes() == data:
                return  # unchanged: a read-only data dir holding a CA still works
        _atomic_write(self.bundle_path, data, 0o644)

    @property
    def permitted(self) -> list[str]:
        return permitted_names(self.cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def check_name(self, host: str) -> str:
        """The normalized ``host``, or NameRefused: never build a path or a leaf from anything else."""
        name = normalize_host(host) if isinstance(host, str) else ""
        if not valid_hostname(name):
            raise NameRefused(f"{host!r} is not a host name")
        if not is_covered(name, self._permitted):
            raise NameRefused(f"{name} is outside the CA's name constraints")
        return name

    @property
    def context_count(self) -> int:
        with self._cache_lock:
            return len(self._pinned) + len(self._lru)

    def _cached(self, host: str) -> ssl.SSLContext | None:
        with self._cache_lock:
            ctx = self._pinned.get(host)
            if ctx is None and (ctx := self._lru.get(host)) is not None:
                self._lru.move_to_end(host)
            return ctx

    def context_for(self, host: str, pin: bool = True) -> ssl.SSLContext:
        """Blocking; ``pin`` (configured hosts) keeps the context for good and its leaf in leaves/."""
        return self._get(self.check_name(host), pin)

    async def context(self, host: str) -> ssl.SSLContext:
        """A server SSLContext for a client-chosen ``host``, made in a worker thread; concurrent first
        asks for one name share one job, and a waiter that leaves does not cancel it for the others."""
        name = self.check_name(host)
        ctx = self._cached(name)
        if ctx is not None:
            return ctx
        fut = self._inflight.get(name)
        if fut is None:
            fut = asyncio.get_running_loop().run_in_executor(self._pool, self._get, name, False)
            self._inflight[name] = fut
            fut.add_done_callback(lambda f: self._job_done(name, f))
        return await asyncio.shield(fut)

    def _job_done(self, name: str, fut: asyncio.Future[ssl.SSLContext]) -> None:
        self._inflight.pop(name, None)
        if not fut.cancelled():
            fut.exception()  # retrieved here: every waiter may have left

    def _get(self, host: str, pin: bool) -> ssl.SSLContext:
        with self._make_lock:
            ctx = self._cached(host)
            pin = pin and host not in self._pinned and len(self._pinned) < MAX_PINNED
            if ctx is not None and not pin:
                return ctx
            ctx = self._new_context(host, persist=pin)
            with self._cache_lock:
                if pin:
                    self._pinned[host] = ctx
                    self._lru.pop(host, None)
                else:
                    self._lru[host] = ctx
                    while len(self._lru) > self.max_contexts:
                        self._lru.popitem(last=False)
            return ctx

    def _new_context(self, host: str, persist: bool) -> ssl.SSLContext:
        leaf = sign_leaf(host, self.cert, self.key, self.leaf_key)
        chain = leaf.public_bytes(serialization.Encoding.PEM) + self.pem()
        if persist:
            self._keep_leaf(host, chain)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        _load_chain(ctx, chain + self._leaf_key_pem, self.dir)
        return ctx

    def _keep_leaf(self, host: str, chain: bytes) -> None:
        """Configured hosts' leaves stay in leaves/ for `openssl verify`; unwritable costs a warning."""
        path = self.leaf_dir / f"{host}.pem"
        assert path.parent == self.leaf_dir  # check_name let through no '/' and no '..'
        try:
            self.leaf_dir.mkdir(exist_ok=True)
            _atomic_write(path, chain, 0o644)
        except OSError as e:
            log.warning("cannot keep the leaf for %s in %s: %s", host, self.leaf_dir, e.strerror)


def _load_chain(ctx: ssl.SSLContext, pem: bytes, tmp_dir: Path) -> None:
    """load_cert_chain reads files only: a memfd on Linux, else a 0600 mkstemp file removed once loaded."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd, tmp = os.memfd_create("politeproxy-leaf"), ""
    else:
        fd, tmp = tempfile.mkstemp(prefix=".leaf-", suffix=".tmp", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            ctx.load_cert_chain(tmp or f"/proc/self/fd/{fd}")
    finally:
        if tmp:
            os.unlink(tmp)
