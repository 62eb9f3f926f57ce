"""Issue 9, the CA's part: names never reach a path (8), bounded contexts and nothing on disk for client
names (9), no IP/e-mail/URI leaf verifies (10), signing off the event loop and race-free files (23),
corrupt CA files are one line (25), keys readable by others are fixed loudly (26).

Unit tests run a CertificateAuthority in a tmp dir; constraint tests use `openssl verify`, curl, and
real TLS handshakes on 127.0.0.1 sockets; two tests run real proxy processes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.hosts import HostSet, is_covered, normalize_host, valid_hostname
from politeproxy.proxy import ca as ca_mod
from politeproxy.proxy import intercept
from politeproxy.proxy.ca import CAError, CertificateAuthority, NameRefused, constraints_current
from tests.conftest import ROOT, Certs, Upstream, need_tool
from tests.e2e.test_proxy_io import FAST, ProxyFactory, connect_tunnel, tls_through_proxy, upstream_toml

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


# -- 8: client-chosen names never reach a path ---------------------------------------------------------

PATH_LIKE = [
    "../../x.commoncrawl.org",
    "../../../../x.commoncrawl.org",
    "a/../../x.commoncrawl.org",
    "x.commoncrawl.org/../../y",
    "..",
    "x.commoncrawl.org\x00",
    "x..commoncrawl.org",
    "",
]


@pytest.mark.parametrize("name", PATH_LIKE)
def test_path_like_names_are_refused_and_write_nothing(tmp_path: Path, name: str) -> None:
    d = tmp_path / "a" / "b" / "data"
    ca = new_ca(d)
    before = files_under(tmp_path)
    with pytest.raises(NameRefused):
        ca.context_for(name)
    with pytest.raises(ValueError):  # NameRefused is a ValueError too
        asyncio.run(ca.context(name))
    assert files_under(tmp_path) == before


def test_absolute_path_names_are_refused_and_write_nothing(tmp_path: Path) -> None:
    """`CONNECT /abs/dir/x.commoncrawl.org:443` once wrote /abs/dir/x.commoncrawl.org.pem."""
    outside = tmp_path / "outside"
    outside.mkdir()
    ca = new_ca(tmp_path / "data")
    before = files_under(tmp_path)
    for name in (f"{outside}/x.commoncrawl.org", f"/{outside.name}/x.commoncrawl.org"):
        with pytest.raises(NameRefused):
            ca.context_for(name)
    assert files_under(tmp_path) == before
    assert not list(outside.iterdir())


@pytest.mark.parametrize("name", ["example.com", "commoncrawl.org.evil.example", "127.0.0.1", "[::1]"])
def test_names_outside_the_constraints_are_refused(tmp_path: Path, name: str) -> None:
    ca = new_ca(tmp_path / "data")
    before = files_under(tmp_path)
    with pytest.raises(NameRefused):
        ca.context_for(name)
    with pytest.raises(NameRefused):
        asyncio.run(ca.context(name))
    assert files_under(tmp_path) == before


NEAR_NAMES = st.lists(
    st.sampled_from(["commoncrawl", "org", "data", "..", ".", "/", "\\", "-", "x", "\x00", " ", "%2e", "A"]),
    max_size=8,
).map("".join)


def test_property_the_ca_refuses_or_serves_and_never_writes(tmp_path: Path) -> None:
    ca = new_ca(tmp_path / "data")
    before = files_under(tmp_path)

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.text(max_size=40), NEAR_NAMES, NEAR_NAMES.map(lambda s: s + ".commoncrawl.org")))
    def prop(name: str) -> None:
        """Any string either raises NameRefused, or is a valid host name under the CA's constraints and
        gets an SSLContext; nothing else is raised, and no file appears anywhere under the tmp dir."""
        ok = valid_hostname(normalize_host(name)) and is_covered(normalize_host(name), PERMITTED)
        try:
            ctx = ca.context_for(name, pin=False)
        except NameRefused:
            assert not ok, name
        else:
            assert ok and isinstance(ctx, ssl.SSLContext), name
        assert files_under(tmp_path) == before

    prop()


# -- 9: bounded contexts, nothing on disk for client names ---------------------------------------------


def test_client_names_are_bounded_in_memory_and_leave_nothing_on_disk(tmp_path: Path) -> None:
    d = tmp_path / "data"
    ca = new_ca(d, max_contexts=8)
    pinned = {h: ca.context_for(h) for h in CONFIGURED}  # what app.py pre-warms
    assert {p.stem for p in (d / "leaves").glob("*.pem")} == set(CONFIGURED)
    before = files_under(tmp_path)

    async def main() -> list[ssl.SSLContext]:
        return [await ca.context(f"n{i}.commoncrawl.org") for i in range(40)]

    made = asyncio.run(main())
    assert len(made) == 40
    assert files_under(tmp_path) == before  # no leaf, no temp file left
    assert ca.context_count <= 8 + len(CONFIGURED)
    # The configured hosts stay pinned; the most recent names are cached, the oldest were evicted.
    assert all(asyncio.run(ca.context(h)) is ctx for h, ctx in pinned.items())
    assert asyncio.run(ca.context("n39.commoncrawl.org")) is made[39]
    assert asyncio.run(ca.context("n0.commoncrawl.org")) is not made[0]
    assert ca.context_count <= 8 + len(CONFIGURED)


def test_unpinned_blocking_contexts_are_bounded_too(tmp_path: Path) -> None:
    d = tmp_path / "data"
    ca = new_ca(d, max_contexts=4)
    before = files_under(tmp_path)
    for i in range(12):
        ca.context_for(f"m{i}.commoncrawl.org", pin=False)
    assert ca.context_count == 4
    assert files_under(tmp_path) == before


def test_a_client_context_serves_a_verified_handshake(tmp_path: Path) -> None:
    """The memfd-loaded context presents a chain that Python verifies against ca.pem."""
    d = tmp_path / "data"
    ca = new_ca(d)
    ctx = asyncio.run(ca.context("fresh.commoncrawl.org"))
    with tls_server(ctx) as port:
        client_handshake(port, "fresh.commoncrawl.org", d / "ca.pem")


def test_proxy_writes_no_leaf_for_client_names(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    """Through a real proxy: TLS to five names nobody configured leaves only the configured leaves."""
    p = proxy_factory(None, FAST + upstream_toml(upstream, certs))
    leaves = p.data_dir / "leaves"
    configured = sorted(x.name for x in leaves.glob("*.pem"))
    before = files_under(p.data_dir)
    for i in range(5):
        with tls_through_proxy(p.port, f"nx{i}.commoncrawl.org", p.data_dir / "ca.pem"):
            pass
    assert sorted(x.name for x in leaves.glob("*.pem")) == configured
    assert {f for f in files_under(p.data_dir) - before if "leaf" in f or f.endswith(".pem")} == set()


def test_proxy_refuses_a_path_like_connect_and_writes_nothing_outside(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, tmp_path: Path
) -> None:
    p = proxy_factory(None, FAST + upstream_toml(upstream, certs))
    before = files_under(tmp_path)
    for target in ("../../x.commoncrawl.org:443", f"{tmp_path}/x.commoncrawl.org:443"):
        s, head = connect_tunnel(p.port, target)
        s.close()
        assert not head.startswith(b"HTTP/1.1 200"), head
    new = files_under(tmp_path) - before
    assert not {f for f in new if "x.commoncrawl.org" in f}, new


# -- 10: no leaf for an IP, an e-mail or a URI verifies ------------------------------------------------


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


# -- 23: signing off the loop, one job per name, race-free files ---------------------------------------


def test_context_signs_off_the_loop_and_shares_one_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = new_ca(tmp_path / "data")
    real = ca_mod.sign_leaf
    calls: list[tuple[str, int]] = []

    def recording(host: str, *a: object) -> x509.Certificate:
        calls.append((host, threading.get_ident()))
        return real(host, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(ca_mod, "sign_leaf", recording)

    async def main() -> tuple[int, list[ssl.SSLContext]]:
        got = await asyncio.gather(*(ca.context("same.commoncrawl.org") for _ in range(20)))
        return threading.get_ident(), got

    loop_thread, got = asyncio.run(main())
    assert [h for h, _ in calls] == ["same.commoncrawl.org"]  # twenty asks, one signature
    assert all(c is got[0] for c in got)
    assert loop_thread not in {t for _, t in calls}


def test_a_waiter_that_leaves_does_not_cancel_the_job(tmp_path: Path) -> None:
    ca = new_ca(tmp_path / "data")

    async def main() -> ssl.SSLContext:
        first = asyncio.create_task(ca.context("leaver.commoncrawl.org"))
        second = asyncio.create_task(ca.context("leaver.commoncrawl.org"))
        await asyncio.sleep(0)
        first.cancel()
        return await second

    assert isinstance(asyncio.run(main()), ssl.SSLContext)
    assert asyncio.run(ca.context("leaver.commoncrawl.org")) is not None


async def serve_upgrade(ca: CertificateAuthority, host: str) -> tuple[asyncio.AbstractServer, int]:
    """An asyncio server that hands each connection to intercept.upgrade with the CA's async getter and
    echoes what arrives over TLS."""

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport

        def data_received(self, data: bytes) -> None:
            self.t.write(data)  # type: ignore[attr-defined]

    class Front(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            coro = intercept.upgrade(
                transport,  # type: ignore[arg-type]
                "test",
                host,
                443,
                b"",
                context_for=ca.context,
                handshake_timeout=10,
                attach=lambda tls: Echo(),
            )
            self.task = asyncio.get_running_loop().create_task(coro)

    server = await asyncio.get_running_loop().create_server(Front, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def blocking_client(port: int, host: str, cafile: Path) -> bytes:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = raw.recv(1)
        if not chunk:
            return head
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raw.close()
        return head
    with ssl.create_default_context(cafile=str(cafile)).wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(b"ping")
        return head + tls.recv(4)


@pytest.mark.parametrize(("host", "want"), [("fresh.commoncrawl.org", b"ping"), ("example.com", b"403")])
def test_upgrade_uses_the_async_getter(tmp_path: Path, host: str, want: bytes) -> None:
    """intercept.upgrade awaits CertificateAuthority.context: a fresh name is served over verified TLS;
    a name the CA refuses gets a 403 before any TLS."""
    ca = new_ca(tmp_path / "data")

    async def main() -> bytes:
        server, port = await serve_upgrade(ca, host)
        try:
            return await asyncio.to_thread(blocking_client, port, host, tmp_path / "data" / "ca.pem")
        finally:
            server.close()

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert want in got, got


RACE = textwrap.dedent(
    """
    import sys, time
    from cryptography.hazmat.primitives import hashes
    from politeproxy.policy.hosts import HostSet
    from politeproxy.proxy.ca import CertificateAuthority
    start = float(sys.argv[2])
    while time.time() < start:
        pass
    ca = CertificateAuthority(sys.argv[1], HostSet().permitted_subtrees())
    for _ in range(20):
        ca.bundle_path.unlink(missing_ok=True)  # force a bundle write each round
        ca._write_bundle()
    print(ca.cert.fingerprint(hashes.SHA256()).hex())
    """
)


def test_proxies_starting_together_share_one_ca_and_never_collide(tmp_path: Path) -> None:
    """Six processes make the CA in one empty dir at the same instant and rewrite the bundle: all
    succeed, all use one CA, and the files on disk are a matching pair."""
    d = tmp_path / "data"
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(d), str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-800:] for _, e in outs]
    assert len({o.strip() for o, _ in outs}) == 1, outs
    ca = new_ca(d)  # loads: the pair on disk matches
    assert ca.cert.fingerprint(hashes.SHA256()).hex() == outs[0][0].strip()
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


# -- 25: corrupt CA files are one line ------------------------------------------------------------------


def corrupt(d: Path, which: str) -> Path:
    new_ca(d)
    if which == "cert-garbage":
        (d / "ca.pem").write_bytes(
            b"-----BEGIN CERTIFICATE-----\ngarbage\x00\xff\n-----END CERTIFICATE-----\n"
        )
        return d / "ca.pem"
    if which == "cert-empty":
        (d / "ca.pem").write_bytes(b"")
        return d / "ca.pem"
    if which == "key-garbage":
        (d / "ca-key.pem").write_bytes(os.urandom(64))
        return d / "ca-key.pem"
    if which == "key-mismatch":
        (d / "ca-key.pem").write_bytes(pem_key(ec.generate_private_key(ec.SECP256R1())))
        return d / "ca-key.pem"
    (d / "ca-key.pem").unlink()  # "key-missing"
    return d / "ca.pem"


@pytest.mark.parametrize(
    "which", ["cert-garbage", "cert-empty", "key-garbage", "key-mismatch", "key-missing"]
)
def test_a_corrupt_ca_file_is_one_line_naming_it(tmp_path: Path, which: str) -> None:
    d = tmp_path / "data"
    named = corrupt(d, which)
    kept = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    with pytest.raises(CAError) as e:
        new_ca(d)
    msg = str(e.value)
    assert "\n" not in msg and str(named) in msg, msg
    assert "move ca.pem and ca-key.pem away" in msg or "restore" in msg, msg
    # Nothing was replaced behind the user's back.
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name in kept} == kept


def test_a_corrupt_leaf_key_is_replaced_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "data"
    new_ca(d)
    (d / "leaf-key.pem").write_bytes(b"not a key")
    with caplog.at_level(logging.WARNING, "politeproxy.proxy.ca"):
        ca = new_ca(d)
    assert "leaf-key.pem" in caplog.text
    ca.context_for("data.commoncrawl.org")


# -- 26: keys readable by others ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ca-key.pem", "leaf-key.pem"])
def test_a_key_readable_by_others_is_made_private_loudly(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "data"
    new_ca(d)
    (d / name).chmod(0o644)
    with caplog.at_level(logging.WARNING, "politeproxy.proxy.ca"):
        new_ca(d)
    assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    assert "READABLE BY OTHERS" in caplog.text and name in caplog.text, caplog.text


def test_a_key_that_cannot_be_made_private_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chmod cannot fail for root (the test runner here), so its failure is simulated."""
    d = tmp_path / "data"
    new_ca(d)
    (d / "ca-key.pem").chmod(0o644)

    def denied(path: object, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(ca_mod.os, "chmod", denied)
    with pytest.raises(CAError, match="readable by others"):
        new_ca(d)


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
