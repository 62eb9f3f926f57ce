"""The file store: the ccrawl record, restart survival, one budget across stores and processes, the
flock (one coroutine at a time, timeouts), bounded fds, unusable directories."""

from __future__ import annotations

import asyncio
import fcntl
import multiprocessing
import os
import struct
from pathlib import Path

import pytest

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.slots import Outcome
from politeproxy.stores import file as file_mod
from politeproxy.stores import flock as flock_mod
from politeproxy.stores.base import StoreError
from politeproxy.stores.file import FileStore
from tests.support.store_helpers import NOJITTER, T0, Clock, H

NS = 1_000_000_000


def read_lock(data_dir: Path) -> tuple[int, int]:
    data = (data_dir / "ratelimit.lock").read_bytes()
    assert len(data) == 16
    return struct.unpack(">QQ", data)


async def test_file_store_writes_ccrawls_record(tmp_path: Path) -> None:
    clock = Clock()
    s = FileStore(tmp_path, clock)
    for _ in range(3):
        await s.claim("data.commoncrawl.org", 0.2, 0.0, None)
    nxt, count = read_lock(tmp_path)
    assert count == 3
    assert nxt == pytest.approx(int((T0 + 0.6) * NS), abs=1000)
    # A record someone else (ccrawl) wrote is honoured: its next slot and its count carry on.
    (tmp_path / "ratelimit.lock").write_bytes(struct.pack(">QQ", int((T0 + 5) * NS), 1000))
    c = await s.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.wait == pytest.approx(5.0)
    nxt, count = read_lock(tmp_path)
    assert count == 1001 and nxt == pytest.approx(int((T0 + 5.2) * NS), abs=1000)
    await s.close()


async def test_file_store_short_file_and_clock_jump(tmp_path: Path) -> None:
    clock = Clock()
    (tmp_path / "ratelimit.lock").write_bytes(b"\x00\x01")  # a torn or foreign file: start afresh
    s = FileStore(tmp_path, clock)
    c = await s.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.granted and c.wait == 0.0
    assert read_lock(tmp_path)[1] == 1
    # The wall clock jumped back a day: a record far in the future must not stall pacing for a day; it
    # counts as now + one gap.
    clock.t += 1.0
    (tmp_path / "ratelimit.lock").write_bytes(struct.pack(">QQ", int((T0 + 86400) * NS), 7))
    c = await s.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.granted and c.wait == pytest.approx(0.2)
    assert read_lock(tmp_path)[1] == 8
    await s.close()


async def test_file_store_state_survives_restart(tmp_path: Path) -> None:
    clock = Clock()
    a = FileStore(tmp_path, clock)
    await a.throttled("data.commoncrawl.org", 30.0, NOJITTER)
    await a.set_crawl_delay("index.commoncrawl.org", 2.0, ttl=600)
    await a.claim("index.commoncrawl.org", 0.2, 1.0, None)
    # No close: as after kill -9. A second store on the same dir sees everything.
    clock.t += 5
    b = FileStore(tmp_path, clock)
    view = await b.host_view("data.commoncrawl.org")
    assert view.throttles == 1 and view.backoff_in == pytest.approx(25.0)
    c = await b.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and c.wait == pytest.approx(25.0)
    iv = await b.host_view("index.commoncrawl.org")
    assert iv.crawl_delay == 2.0 and iv.robots_fresh
    assert await b.grants() == 1
    await a.close()
    await b.close()


async def test_two_file_stores_share_one_budget(tmp_path: Path) -> None:
    clock = Clock()
    a, b = FileStore(tmp_path, clock), FileStore(tmp_path, clock)
    slots = []
    for i in range(6):
        s = a if i % 2 else b
        slots.append((await s.claim(f"h{i % 3}.commoncrawl.org", 0.1, 0.0, None)).at)
    assert slots == pytest.approx([T0 + 0.1 * i for i in range(6)])
    assert await a.grants() == await b.grants() == 6
    await a.close()
    await b.close()


def _claim_many(data_dir: str, n: int, gap: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def run() -> list[float]:
        s = FileStore(Path(data_dir))
        got = []
        for i in range(n):
            c = await s.claim(f"h{i % 2}.commoncrawl.org", gap, 0.0, None)
            assert c.granted
            got.append(c.at)
        await s.close()
        return got

    out.put(asyncio.run(run()))


@pytest.mark.slow  # contending processes: ~2-4 s
def test_file_store_claims_are_atomic_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    gap, n, procs = 0.001, 150, 4
    ps = [ctx.Process(target=_claim_many, args=(str(tmp_path), n, gap, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    slots = sorted(s for _ in ps for s in out.get(timeout=60))
    for p in ps:
        p.join(10)
        assert p.exitcode == 0
    assert len(slots) == n * procs
    assert read_lock(tmp_path)[1] == n * procs
    diffs = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    assert min(diffs) >= gap - 1e-6  # no two processes ever got the same (or a too-close) slot


def test_file_store_unopenable_dir_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        FileStore(blocker)
    assert os.path.isfile(blocker)


async def test_one_coroutine_at_a_time_takes_the_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flock belongs to the open file description all coroutines share; two waiting at once would both
    "get" it, and the first unlock would end the second's critical section while another process writes."""
    s = FileStore(tmp_path)
    holder = os.open(tmp_path / "ratelimit.lock", os.O_RDWR)  # another process, as far as flock is concerned
    fcntl.flock(holder, fcntl.LOCK_EX)
    real_run = flock_mod.LockWait.run
    waiting, peak = 0, 0

    def counting_run(self: flock_mod.LockWait) -> bool:  # a contended wait, in the lock thread
        nonlocal waiting, peak
        waiting += 1
        peak = max(peak, waiting)
        try:
            return real_run(self)
        finally:
            waiting -= 1

    monkeypatch.setattr(flock_mod.LockWait, "run", counting_run)
    policy = BackoffPolicy(jitter=0.0)
    ops = [s.claim("data.commoncrawl.org", 0.01, 0.0, None) for _ in range(3)]
    ops += [s.throttled("index.commoncrawl.org", 0.0, policy), s.host_view("data.commoncrawl.org")]
    tasks = [asyncio.ensure_future(op) for op in ops]
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in tasks)  # all held up by the other process
    fcntl.flock(holder, fcntl.LOCK_UN)
    await asyncio.gather(*tasks)
    assert peak == 1
    assert read_lock(tmp_path)[1] == 3
    assert (await s.host_view("index.commoncrawl.org")).throttles == 1
    os.close(holder)
    await s.close()


# -- issue 9: fds, the flock thread --------------------------------------------------------------------


async def test_file_store_keeps_a_bounded_number_of_fds(tmp_path: Path) -> None:
    """Every distinct host name cost an open fd for good (item 9): 200 names now hold at most 64."""
    s = FileStore(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(200):
        await s.claim(f"h{i}.data.commoncrawl.org", 0.0, 1.0, None)
    assert len(os.listdir("/proc/self/fd")) - before <= file_mod.MAX_HOST_FDS
    # an evicted host's record is read back from its file
    assert (await s.claim("h0.data.commoncrawl.org", 0.0, 1.0, None)).outcome is Outcome.HOST_NOT_READY
    await s.close()


HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""

TAKER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


async def test_a_timed_out_lock_wait_leaves_the_lock_free(tmp_path: Path) -> None:
    """Another process holds the flock; a claim times out; the holder lets go (item 16). Before, the
    waiting thread then took the lock and nobody released it: ccrawl and other proxies were locked out."""
    import subprocess
    import sys

    s = FileStore(tmp_path)
    s.lock_timeout = 0.3
    path = str(tmp_path / "ratelimit.lock")
    holder = subprocess.Popen(  # noqa: ASYNC220 - a plain child process holding the lock
        [sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError):
            await s.claim(H, 0.1, 0.0, None)
    finally:
        holder.communicate("\n", timeout=5)
    await asyncio.sleep(0.3)  # the old thread would have taken the lock by now
    taker = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", TAKER, path], capture_output=True, text=True, timeout=10
    )
    assert taker.stdout.strip() == "free"
    assert (await s.claim(H, 0.1, 0.0, None)).granted  # and this store still works
    await s.close()
