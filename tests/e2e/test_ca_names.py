"""Issue 9, the CA's part for client-chosen names: they never reach a path (8), and contexts for them are
bounded in memory and leave nothing on disk (9). A CertificateAuthority in a tmp dir, real TLS handshakes
on 127.0.0.1, and one shared proxy process for the two cases through a real proxy.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.hosts import is_covered, normalize_host, valid_hostname
from politeproxy.proxy.door.ca import NameRefused
from tests.support.catools import CONFIGURED, PERMITTED, client_handshake, files_under, new_ca, tls_server
from tests.support.proxy_proc import ProxyProc
from tests.support.proxyio import connect_tunnel, tls_through_proxy

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


@pytest.mark.slow  # 300 hypothesis examples, each minting a leaf: ~3 s
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


def test_proxy_writes_no_leaf_for_client_names(shared_fast_proxy: ProxyProc) -> None:
    """Through a real proxy: TLS to five names nobody configured leaves only the configured leaves."""
    p = shared_fast_proxy
    leaves = p.data_dir / "leaves"
    configured = sorted(x.name for x in leaves.glob("*.pem"))
    before = files_under(p.data_dir)
    for i in range(5):
        with tls_through_proxy(p.port, f"nx{i}.commoncrawl.org", p.data_dir / "ca.pem"):
            pass
    assert sorted(x.name for x in leaves.glob("*.pem")) == configured
    assert {f for f in files_under(p.data_dir) - before if "leaf" in f or f.endswith(".pem")} == set()


def test_proxy_refuses_a_path_like_connect_and_writes_nothing_outside(
    shared_fast_proxy: ProxyProc, tmp_path: Path
) -> None:
    p = shared_fast_proxy
    roots = (tmp_path, p.data_dir.parent)  # the named directory, and the one holding the proxy's files
    before = [files_under(r) for r in roots]
    for target in ("../../x.commoncrawl.org:443", f"{tmp_path}/x.commoncrawl.org:443"):
        s, head = connect_tunnel(p.port, target)
        s.close()
        assert not head.startswith(b"HTTP/1.1 200"), head
    for root, old in zip(roots, before, strict=True):
        new = files_under(root) - old
        assert not {f for f in new if "x.commoncrawl.org" in f}, new
