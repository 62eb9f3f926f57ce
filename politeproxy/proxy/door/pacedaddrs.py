"""Which paced name an address belongs to: the check behind ``allow_ip_connect``.

A CONNECT to an IP literal has no name to pace or sign for. With ``allow_ip_connect`` it is tunnelled,
unless the address is one a paced name resolves to (then only a TLS hello naming a paced host opens it,
intercepted and paced). The concrete paced names (``HostSet.concrete_hosts``) are resolved per port,
through the operator's ``upstream.resolve`` map first, and remembered for ``ttl`` seconds; one refresh
runs at a time, bounded by ``timeout``. A name that does not resolve is skipped. A name the map sends
somewhere on every port of ``PORTS`` is not looked up at all: the proxy never asks DNS for it, so what the
machine's resolver says of it (an ``/etc/hosts`` line pointing it at a local stand-in) is beside the
point. Addresses a CDN rotates through are only as complete as one resolution: the default stays off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable

from politeproxy.policy.routing import Address, Target, unmap
from politeproxy.proxy.door.tunnel import resolve

log = logging.getLogger("politeproxy")

TTL = 60.0  # seconds an address list is trusted: DNS answers for CloudFront live about this long
PORTS = (443, 80)  # where the operator's map is read for each name, besides the port asked about

Table = dict[tuple[Address, int | None], str]  # (address, port) from the map; (address, None) from DNS
Resolve = Callable[[Target], Awaitable[list[Address]]]  # tunnel.resolve, or a test's stub


def _address(text: str) -> Address | None:
    with contextlib.suppress(ValueError):
        return unmap(ipaddress.ip_address(text.split("%", 1)[0]))
    return None


class PacedAddresses:
    """``await owner(ip, port)``: the paced name that resolves to ``ip`` (or is mapped to ``ip:port``
    by ``upstream.resolve``), or None."""

    def __init__(
        self,
        names: Callable[[], list[str]],
        lookup: Callable[[str, int], tuple[str, int] | None],
        timeout: float,
        ttl: float = TTL,
        resolve_target: Resolve = resolve,
    ) -> None:
        self.names = names
        self.resolve_target = resolve_target
        self.lookup = lookup
        self.timeout = timeout
        self.ttl = ttl
        self._table: Table = {}
        self._expires = 0.0
        self._refresh: asyncio.Task[Table] | None = None

    async def owner(self, ip: Address, port: int) -> str | None:
        a = unmap(ip)
        table = await self._current()
        return table.get((a, port)) or table.get((a, None)) or self._mapped(a, port)

    def _mapped(self, a: Address, port: int) -> str | None:
        """The map read for the port asked about (it may name any port): no resolution, never stale."""
        for name in self.names():
            m = self.lookup(name, port)
            if m is not None and _address(m[0]) == a and m[1] == port:
                return name
        return None

    async def _current(self) -> Table:
        if self._expires > time.monotonic():
            return self._table
        if self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._resolve_all())
        task = self._refresh
        try:
            table = await asyncio.shield(task)  # a client that leaves does not cancel the others' wait
        finally:
            if task.done() and self._refresh is task:
                self._refresh = None
        self._table, self._expires = table, time.monotonic() + self.ttl
        return table

    async def _resolve_all(self) -> Table:
        names = self.names()
        table: Table = {}
        for name in names:
            for p in PORTS:
                m = self.lookup(name, p)
                a = _address(m[0]) if m is not None else None
                if m is not None and a is not None:
                    table.setdefault((a, m[1]), name)
        asked = [n for n in names if any(self.lookup(n, p) is None for p in PORTS)]
        got = await asyncio.gather(*(self._resolve(n) for n in asked), return_exceptions=True)
        for name, addrs in zip(asked, got, strict=True):
            if isinstance(addrs, BaseException):
                log.debug("paced name %s does not resolve: %s", name, addrs)
                continue
            for a in addrs:
                table.setdefault((a, None), name)
        return table

    async def _resolve(self, name: str) -> list[Address]:
        async with asyncio.timeout(self.timeout):
            return [unmap(a) for a in await self.resolve_target(Target(name, 443))]
