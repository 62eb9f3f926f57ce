"""Bytes nobody asked for (issue 25): an idle pooled upstream connection the upstream spoke on is closed,
never reused, in both upstream clients. Sent on such a connection, the next request would take those bytes
as its answer: the lean client checks with ``unread`` before it reuses one (h1client), aiohttp's pool with
``CheckedConnector`` (upstream). The lean client's connection also closes itself when its loop reads them
(h1conn)."""

from __future__ import annotations

import asyncio
import select
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from aiohttp.client_reqrep import ConnectionKey
    from aiohttp.tracing import Trace


def unread(transport: asyncio.BaseTransport | None) -> bool:
    """Whether bytes (or an end) wait unread in the kernel for an idle pooled connection. Nothing was asked
    on it, so they are bytes nobody asked for: sent on it, the next request would take them as its answer
    (the loop may not have read them yet when a request takes the connection). One poll(2), no read."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False  # a transport that shows no socket: its data_received still closes such a connection
    try:
        fd = sock.fileno()
        if fd < 0:
            return True
        p = select.poll()
        p.register(fd, select.POLLIN | select.POLLPRI)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True  # cannot look: do not trust it


class CheckedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, except that an idle connection the upstream spoke on is closed, never reused.

    aiohttp keeps what arrives on an idle connection (parsed into its queue, or left in the kernel until
    the loop reads it) and hands it to the next request sent on it as that request's answer. Overrides
    ``_get``, the pool's reuse step (an aiohttp internal, 3.14; tests/unit/proxy/test_pool_unsolicited.py
    fails if it stops being called)."""

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> aiohttp.connector.Connection | None:
        while (conn := await super()._get(key, traces)) is not None:
            proto = conn.protocol
            if proto is not None and not proto.should_close and not unread(proto.transport):
                return conn
            conn.close()  # released with should_close: the transport is closed
        return None
