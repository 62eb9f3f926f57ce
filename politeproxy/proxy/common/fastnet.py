"""Optional faster transports: aiofastnet's C/Cython TCP and TLS transports, patched into the running loop.

Installed with ``pip install politeproxy[fast]``. aiofastnet replaces the loop's ``create_connection``,
``create_server`` and ``start_tls`` (on uvloop and on the standard loop alike), so both TLS legs of an
intercepted request, towards the client and towards the upstream, run through it; nothing else changes.
Absent, or turned off with ``POLITEPROXY_FASTNET=0``, the loop's own transports serve as before.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import ssl

log = logging.getLogger("politeproxy")

OFF_WORDS = frozenset({"0", "off", "no", "false"})


def enable(loop: asyncio.AbstractEventLoop | None = None) -> str | None:
    """Patch ``loop`` (default: the running one) with aiofastnet before any server or connection is made.
    Returns what now carries the sockets (``"aiofastnet X.Y"``), or None when the loop's own do. Never
    raises: a missing or broken optional extra leaves the loop as it was."""
    if os.environ.get("POLITEPROXY_FASTNET", "").strip().lower() in OFF_WORDS:
        return None
    try:
        fast = importlib.import_module("aiofastnet")
    except ImportError:
        return None
    loop = loop or asyncio.get_running_loop()
    try:
        fast.patch_loop(loop)
    except Exception as e:  # noqa: BLE001 - an optional speed-up must never stop the proxy
        log.warning("aiofastnet could not patch the event loop (%s); using the loop's own transports", e)
        return None
    return f"aiofastnet {getattr(fast, '__version__', '?')}"


NO_CLOSE_NOTIFY = "TLS closed without close_notify"


def close_notify_missing(tls: object) -> str | None:
    """After the peer's end, whether its TLS close was clean: a TLS object that read a close_notify says
    "zero return", one whose TCP connection just ended says "want read". None for clean, else why not."""
    try:
        data = tls.read(1)  # type: ignore[attr-defined]
    except ssl.SSLZeroReturnError:
        return None
    except (ssl.SSLError, ValueError, OSError, AttributeError):
        return NO_CLOSE_NOTIFY
    return None if data == b"" else NO_CLOSE_NOTIFY


def tls_object(transport: asyncio.BaseTransport) -> object | None:
    """The TLS object of a transport (``ssl.SSLObject`` on asyncio's and uvloop's transports; aiofastnet's
    may not offer one), or None."""
    try:
        found: object | None = transport.get_extra_info("ssl_object")
    except Exception:  # noqa: BLE001 - a transport without the extra is simply not probed
        return None
    return found
