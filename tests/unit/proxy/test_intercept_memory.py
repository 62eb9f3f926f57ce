"""Memory per held intercepted connection (issue 15): the TLS layer ``intercept.start_with`` builds for a
connection whose first bytes were read already (a peeked ClientHello) must not hold asyncio's 256 KiB
zero-filled read buffer per connection."""

from __future__ import annotations

import asyncio
import socket
import ssl

from politeproxy.proxy.door import intercept


def test_start_with_read_buffer_is_small() -> None:
    """The protocol start_with installs keeps a read buffer of at most 32 KiB (asyncio's own: 256 KiB)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        task = asyncio.ensure_future(
            intercept.start_with(transport, intercept._Pending(), ctx, b"\x16\x03\x01", 5.0)  # hello start
        )
        await asyncio.sleep(0.05)
        size = len(transport.get_protocol()._ssl_buffer)  # type: ignore[attr-defined]
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - only the buffer size is checked
            pass
        transport.close()
        b.close()
        return size

    assert asyncio.run(main()) <= 32 * 1024
