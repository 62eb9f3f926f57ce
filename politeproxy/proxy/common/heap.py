"""Freed heap pages given back to the system after connection churn (glibc's ``malloc_trim``).

Why: every TLS handshake towards a client allocates and frees tens of KiB in malloc's heap (OpenSSL's
handshake and record buffers, the leaf's chain) between the long-lived objects of the connections made
before it. glibc keeps those freed pages resident: only the top of the heap is ever given back by itself.
With thousands of clients each holding one paced request, that slack was ~15 KiB of the RSS a held
request costs (``bench/held.py --accounts``, issue 44). ``malloc_trim(0)`` hands every whole free page back
(``MADV_DONTNEED``), leaving the heap's layout as it was.

When: a check every ``every`` seconds trims only if at least ``after`` client connections were opened
since the last trim, so a proxy whose clients keep their connections never trims. The trim runs in a worker
thread (ctypes releases the GIL); it takes ~1 ms per 1,000 open TLS connections, during which the event
loop's own allocations from the main heap wait for it. Not glibc (musl, macOS), or
``POLITEPROXY_HEAP_TRIM=0`` in the environment: no trim, nothing else changes.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable

from politeproxy.proxy.common.fastnet import OFF_WORDS

log = logging.getLogger("politeproxy")

TRIM_EVERY = 5.0  # seconds between checks
TRIM_AFTER = 256  # client connections opened since the last trim that make a check trim


def libc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` as a callable, or None where there is none (or the environment says off)."""
    if os.environ.get("POLITEPROXY_HEAP_TRIM", "").strip().lower() in OFF_WORDS:
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


class HeapTrim:
    """Counts new client connections (``opened``); ``run`` trims the heap after enough of them.

    >>> trim = HeapTrim()
    >>> task = loop.create_task(trim.run())   # the listener's, from start() until close()
    >>> trim.opened()                          # per accepted client connection
    """

    __slots__ = ("every", "after", "trim", "new", "trims")

    def __init__(
        self,
        every: float = TRIM_EVERY,
        after: int = TRIM_AFTER,
        trim: Callable[[], object] | None = None,
    ) -> None:
        self.every, self.after = every, after
        self.trim = trim if trim is not None else libc_trim()
        self.new = 0  # client connections opened since the last trim
        self.trims = 0

    def opened(self) -> None:
        self.new += 1

    async def run(self) -> None:
        """Check every ``every`` seconds, until cancelled; never raises otherwise."""
        trim = self.trim
        if trim is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.every)
            if self.new < self.after:
                continue
            self.new = 0
            try:
                await loop.run_in_executor(None, trim)
            except (OSError, RuntimeError) as e:  # no thread to run it in (shutting down): skip it
                log.debug("heap trim skipped: %s", e)
                continue
            self.trims += 1
