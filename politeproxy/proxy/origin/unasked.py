"""Bytes nobody asked for (issue 25): an idle pooled upstream connection the upstream spoke on is closed,
never reused. Sent on such a connection, the next request would take those bytes as its answer: the client
checks with ``unread`` before it reuses one (h1client), for every method; its connection also closes itself
when its loop reads them (h1conn)."""

from __future__ import annotations

import asyncio
import select


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
