"""Which paced name owns an address (proxy/door/pacedaddrs.py, behind allow_ip_connect): the operator's map
and resolution (a stub here: the tests never read the machine's /etc/hosts or DNS, issue 42 item 11),
remembered for the TTL, one refresh at a time."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

from politeproxy.policy.routing import Address, Target
from politeproxy.proxy.door.pacedaddrs import PacedAddresses

V4 = ipaddress.ip_address
NAMES = {"localhost": ["127.0.0.1", "::1"], "data.commoncrawl.org": ["127.0.0.1"]}  # what /etc/hosts may say


async def stub(target: Target) -> list[Address]:
    """A resolver that knows NAMES only (anything else does not resolve), and asks nobody."""
    if target.host not in NAMES:
        raise OSError(f"{target.host} does not resolve")
    return [V4(a) for a in NAMES[target.host]]


def _map(table: dict[str, str]) -> Callable[[str, int], tuple[str, int] | None]:
    def lookup(host: str, port: int) -> tuple[str, int] | None:
        got = table.get(f"{host}:{port}")
        if got is None:
            return None
        h, _, p = got.rpartition(":")
        return h, int(p)

    return lookup


async def test_mapped_and_resolved_addresses_name_their_owner() -> None:
    names = ["data.commoncrawl.org", "localhost"]
    m = _map({"data.commoncrawl.org:443": "127.0.0.5:8443", "data.commoncrawl.org:80": "127.0.0.5:8080"})
    pa = PacedAddresses(lambda: names, m, timeout=5.0, resolve_target=stub)
    assert await pa.owner(V4("127.0.0.5"), 8443) == "data.commoncrawl.org"
    assert await pa.owner(V4("::ffff:127.0.0.5"), 8443) == "data.commoncrawl.org"  # mapped IPv6 form
    assert await pa.owner(V4("127.0.0.5"), 9999) is None  # the map names one port
    assert await pa.owner(V4("127.0.0.1"), 443) == "localhost"  # resolved: any port
    assert await pa.owner(V4("127.0.0.1"), 12345) == "localhost"
    assert await pa.owner(V4("192.0.2.7"), 443) is None


async def test_a_name_that_does_not_resolve_is_skipped() -> None:
    pa = PacedAddresses(
        lambda: ["no-such-name.invalid", "localhost"], _map({}), timeout=5.0, resolve_target=stub
    )
    assert await pa.owner(V4("127.0.0.1"), 443) == "localhost"


async def test_one_refresh_serves_concurrent_asks_and_lasts_the_ttl() -> None:
    calls = 0

    def names() -> list[str]:
        nonlocal calls
        calls += 1
        return ["localhost"]

    pa = PacedAddresses(names, _map({}), timeout=5.0, ttl=60.0, resolve_target=stub)
    got = await asyncio.gather(*(pa.owner(V4("127.0.0.1"), 443) for _ in range(20)))
    assert got == ["localhost"] * 20
    assert calls == 1  # one refresh for the 20 (each found its answer in the table)
    await pa.owner(V4("127.0.0.1"), 443)
    assert calls == 1  # within the TTL: no new resolution


async def test_a_name_mapped_on_every_port_was_read_from_the_machines_hosts_file_too() -> None:
    """Issue 42, item 11: where /etc/hosts points data.commoncrawl.org at 127.0.0.1 (a local stand-in),
    every CONNECT to 127.0.0.1 counted as data.commoncrawl.org's. A name the operator's map sends somewhere
    on every port is not looked up: the proxy never asks DNS for it. A name mapped on one port still is."""
    asked: list[str] = []

    async def counting(target: Target) -> list[Address]:
        asked.append(target.host)
        return await stub(target)

    full = _map({"data.commoncrawl.org:443": "127.0.0.5:8443", "data.commoncrawl.org:80": "127.0.0.5:8080"})
    pa = PacedAddresses(lambda: ["data.commoncrawl.org"], full, timeout=5.0, resolve_target=counting)
    assert await pa.owner(V4("127.0.0.1"), 4443) is None  # an echo server on loopback: not the paced host's
    assert asked == []
    half = _map({"data.commoncrawl.org:443": "127.0.0.5:8443"})
    pa = PacedAddresses(lambda: ["data.commoncrawl.org"], half, timeout=5.0, resolve_target=counting)
    assert await pa.owner(V4("127.0.0.1"), 4443) == "data.commoncrawl.org"  # port 80 goes by DNS: asked
    assert asked == ["data.commoncrawl.org"]
