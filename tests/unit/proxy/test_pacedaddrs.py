"""Which paced name owns an address (proxy/pacedaddrs.py, behind allow_ip_connect): the operator's map
and real resolution (localhost, from /etc/hosts), remembered for the TTL, one refresh at a time."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

from politeproxy.proxy.pacedaddrs import PacedAddresses

V4 = ipaddress.ip_address


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
    m = _map({"data.commoncrawl.org:443": "127.0.0.5:8443"})
    pa = PacedAddresses(lambda: names, m, timeout=5.0)
    assert await pa.owner(V4("127.0.0.5"), 8443) == "data.commoncrawl.org"
    assert await pa.owner(V4("::ffff:127.0.0.5"), 8443) == "data.commoncrawl.org"  # mapped IPv6 form
    assert await pa.owner(V4("127.0.0.5"), 9999) is None  # the map names one port
    assert await pa.owner(V4("127.0.0.1"), 443) == "localhost"  # resolved: any port
    assert await pa.owner(V4("127.0.0.1"), 12345) == "localhost"
    assert await pa.owner(V4("192.0.2.7"), 443) is None


async def test_a_name_that_does_not_resolve_is_skipped() -> None:
    pa = PacedAddresses(lambda: ["no-such-name.invalid", "localhost"], _map({}), timeout=5.0)
    assert await pa.owner(V4("127.0.0.1"), 443) == "localhost"


async def test_one_refresh_serves_concurrent_asks_and_lasts_the_ttl() -> None:
    calls = 0

    def names() -> list[str]:
        nonlocal calls
        calls += 1
        return ["localhost"]

    pa = PacedAddresses(names, _map({}), timeout=5.0, ttl=60.0)
    got = await asyncio.gather(*(pa.owner(V4("127.0.0.1"), 443) for _ in range(20)))
    assert got == ["localhost"] * 20
    assert calls == 1  # one refresh for the 20 (each found its answer in the table)
    await pa.owner(V4("127.0.0.1"), 443)
    assert calls == 1  # within the TTL: no new resolution
