"""Issue 9, the CA's work and files: signing off the event loop with one job per name (23), proxies
starting together share one CA and never collide (23), corrupt CA files are one line (25), and keys
readable by others are made private loudly or refused (26).
"""

from __future__ import annotations

import asyncio
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
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from politeproxy.proxy.door import ca as ca_mod
from politeproxy.proxy.door import intercept
from politeproxy.proxy.door.ca import CAError, CertificateAuthority
from tests.support.catools import new_ca, pem_key
from tests.support.processes import ROOT


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
    from politeproxy.proxy.door.ca import CertificateAuthority
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


@pytest.mark.slow  # several interpreters racing to make one CA (many processes)
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
