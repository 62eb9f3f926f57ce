"""The failover store: when the shared store fails, claims go to a local fallback (wider gaps, one
warning) and back; a backoff read from the shared store is kept in the fallback."""

from __future__ import annotations

import asyncio
import fcntl
import logging
from pathlib import Path

import pytest

from politeproxy.policy.slots import Outcome
from politeproxy.stores import file as file_mod
from politeproxy.stores.base import StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from tests.support.store_helpers import Clock


async def test_lock_failure_raises_store_error_and_failover_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    primary = FileStore(tmp_path, clock)
    fallback = MemoryStore(clock)
    changes: list[tuple[str, bool]] = []
    fo = FailoverStore(
        primary,
        fallback,
        gap_multiplier=3,
        probe_interval=0.05,
        on_change=lambda s, d: changes.append((s.name, d)),
    )
    real_flock = fcntl.flock
    broken = True

    def flaky_flock(fd: int, op: int) -> None:
        if broken:
            raise OSError(37, "No locks available")  # ENOLCK, as on some NFS mounts
        real_flock(fd, op)

    monkeypatch.setattr(file_mod.fcntl, "flock", flaky_flock)
    with pytest.raises(StoreError):
        await primary.claim("data.commoncrawl.org", 0.2, 0.0, None)
    caplog.set_level(logging.INFO, logger="politeproxy.store")
    gap = 0.02
    c1 = await fo.claim("data.commoncrawl.org", gap, 0.0, None)
    assert fo.degraded and fo.name == "memory"
    assert c1.wait <= 3 * gap + 0.001  # at most one widened gap before the first local grant
    await asyncio.sleep(3 * gap + 0.01)
    c2 = await fo.claim("data.commoncrawl.org", gap, 0.0, None)
    c3 = await fo.claim("data.commoncrawl.org", gap, 0.0, None)
    assert c2.granted and c3.granted
    assert c3.wait - c2.wait == pytest.approx(3 * gap)  # never fail open: the gap is widened x3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "failed" in r.getMessage()]
    assert len(warnings) == 1
    assert changes == [("memory", True)]
    broken = False
    for _ in range(100):
        if not fo.degraded:
            break
        await asyncio.sleep(0.02)
    assert not fo.degraded and fo.name == "file"
    assert changes[-1] == ("file", False)
    # The last local grant (c3) may still lie ahead: the first shared grant waits one widened gap after it.
    held = await fo.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert held.outcome is Outcome.HOST_NOT_READY and 0 < held.wait <= 2 * 3 * gap
    await asyncio.sleep(held.wait)
    assert (await fo.claim("data.commoncrawl.org", 0.2, 0.0, None)).granted
    await fo.close()


async def test_a_backoff_read_from_the_shared_store_is_kept_in_the_fallback() -> None:
    """Another proxy's Retry-After, seen on the once-a-second read of the host's state, is mirrored into
    the fallback: an outage that starts next does not let this proxy send into it (the Redis outage fault
    test caught a request 2.4 s into a 4 s backoff when this proxy had not claimed that host in between)."""
    clock = Clock()
    primary, fallback = MemoryStore(clock), MemoryStore(clock)
    fo = FailoverStore(primary, fallback, probe_interval=60.0)
    await primary.mirror_backoff("data.commoncrawl.org", 4.0)  # recorded by another proxy
    assert (await fallback.host_view("data.commoncrawl.org")).backoff_in == 0.0
    view = await fo.host_view("data.commoncrawl.org")
    assert view.backoff_in == pytest.approx(4.0)
    assert (await fallback.host_view("data.commoncrawl.org")).backoff_in == pytest.approx(4.0)
    # A fallback claim now waits the backoff out instead of granting at once.
    c = await fallback.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert not c.granted and c.wait >= 4.0 - 0.001
    await fo.close()
