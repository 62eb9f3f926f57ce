"""The aiohttp client internals the upstream side still relies on, in one place (issue 23). The server side
has none: every client byte is read by the project's own protocol (h1server.py, front.py), so this module
goes when the upstream client is the project's own too (issue 44 item 2).

Checked against aiohttp 3.14.5. tests/unit/proxy/test_aiohttp_seams.py fails, naming what is wrong, when one
of the internals below is gone.

8. ``ClientResponse.connection`` and its ``protocol`` (aiohttp's ResponseHandler), whose ``closed`` future
   ends with an exception on a reset and whose ``eof_received`` hears a TLS close_notify
   (``connection_parts``). Why: upstream.EndWatch tells a cut close-delimited body from a clean end.
9. ``TCPConnector._get(key, traces)`` overridden (unasked.CheckedConnector), and ``ResponseHandler``'s
   ``should_close`` and ``Connection.protocol`` read: a pooled connection handed out is first checked for
   bytes nobody asked for (issue 25 item 4), and one that spoke is closed, never reused.
"""

from __future__ import annotations

import asyncio

import aiohttp

__all__ = ["CHECKED", "connection_parts"]

CHECKED = ((3, 14), (3, 14))  # the aiohttp (major, minor) versions these seams were read against, inclusive


def connection_parts(
    resp: aiohttp.ClientResponse,
) -> tuple[asyncio.Protocol | None, asyncio.Future[None] | None, asyncio.Transport | None]:
    """The protocol of ``resp``'s connection, its ``closed`` future and its transport (8); each None
    when the connection is gone."""
    conn = resp.connection
    proto = conn.protocol if conn is not None else None
    closed = proto.closed if proto is not None else None
    return proto, closed, conn.transport if conn is not None else None
