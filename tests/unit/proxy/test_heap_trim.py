"""The heap trim after connection churn (proxy/common/heap.py, issue 44: memory per held request): it trims
only after enough new connections, gives freed heap pages back for real on glibc, and is off by the
environment."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys

import pytest

from politeproxy.proxy.common import heap


async def test_trims_only_after_enough_new_connections() -> None:
    calls: list[int] = []
    trim = heap.HeapTrim(every=0.01, after=3, trim=lambda: calls.append(1))
    task = asyncio.get_running_loop().create_task(trim.run())
    try:
        trim.opened()
        trim.opened()
        await asyncio.sleep(0.1)  # ten checks: two connections are not enough
        assert calls == []
        trim.opened()
        for _ in range(100):  # the next check trims (bounded wait: 1 s)
            if calls:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and no further check trims again without new connections
        assert calls == [1] and trim.trims == 1 and trim.new == 0
    finally:
        task.cancel()


async def test_no_trim_function_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLITEPROXY_HEAP_TRIM", "off")
    assert heap.libc_trim() is None
    trim = heap.HeapTrim(every=0.01, after=1)
    assert trim.trim is None
    await asyncio.wait_for(trim.run(), 1.0)  # returns: nothing to run


PATTERN = """
import sys
from pathlib import Path
from politeproxy.proxy.common import heap

def rss_anon_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

trim = heap.libc_trim()
bufs, pins = [], []
for _ in range(420):
    bufs.append(bytearray(96 * 1024))  # zero-filled: every page resident; below the mmap threshold
    pins.append(bytearray(1024))  # over pymalloc's 512 bytes: from malloc's heap, after the buffer
before = rss_anon_kib()
del bufs
freed = rss_anon_kib()
trim()
print(before, freed, rss_anon_kib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_libc_trim_gives_freed_heap_pages_back() -> None:
    """Freed chunks in the middle of the heap stay resident until trimmed: 40 MiB of 96 KiB buffers, each
    followed by a small chunk that stays (as a held connection's objects stay between the buffers its
    handshake freed). In a fresh process, so the heap's layout is the pattern's, not earlier tests'."""
    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("not glibc")
    env = {**os.environ, "POLITEPROXY_HEAP_TRIM": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PATTERN], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    before, freed, after = (int(x) for x in out.stdout.split())
    assert before - freed < 20 * 1024, (before, freed)  # free() alone kept most of them resident
    assert freed - after > 20 * 1024, (before, freed, after)  # the trim gave back > half of 40 MiB
