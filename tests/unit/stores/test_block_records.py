"""Issue 12 in the stores, below what the case table can say: a 40-byte host record of an earlier version
still reads (and ratelimit.lock keeps ccrawl's 16 bytes), the record grows to 96 bytes on the next write,
and a store remembers the probe it granted until the probe's answer is recorded (the pacer writes that
success at once)."""

from __future__ import annotations

import struct
from pathlib import Path

from politeproxy.policy.backoff import BackoffPolicy, Kind
from politeproxy.policy.slots import Outcome
from politeproxy.stores.file import FileStore
from politeproxy.stores.file_records import HOST
from politeproxy.stores.memory import MemoryStore

NOW = 1_700_000_000.0
H = "data.commoncrawl.org"
NS = 1_000_000_000


async def test_an_old_40_byte_host_record_still_reads_and_grows_on_write(tmp_path: Path) -> None:
    store = FileStore(tmp_path, lambda: NOW)
    try:
        old = struct.pack(">QQQQQ", 0, int((NOW + 5) * NS), 0, 3, 0)  # a backoff 5 s ahead, 3 throttles
        (tmp_path / "hosts" / H).write_bytes(old)
        view = await store.host_view(H)
        assert view.backoff_in == 5.0 and view.throttles == 3 and view.blocks == 0
        c = await store.claim(H, 0.1, 0.0, None)
        assert c.outcome is Outcome.HOST_NOT_READY and c.wait == 5.0
        await store.throttled(H, None, BackoffPolicy(jitter=0.0, block_hold=7.0), Kind.BLOCK)
        assert len((tmp_path / "hosts" / H).read_bytes()) == HOST.size == 96
        view = await store.host_view(H)
        assert view.blocks == 1 and view.throttles == 4 and view.backoff_in == 7.0
        assert len((tmp_path / "ratelimit.lock").read_bytes()) in (0, 16)
    finally:
        await store.close()


async def test_a_store_remembers_its_probe_until_the_answer() -> None:
    t = [NOW]
    store = MemoryStore(lambda: t[0], rand=lambda: 0.0)
    policy = BackoffPolicy(block_hold=2.0, adaptive=False)
    await store.throttled(H, None, policy, Kind.BLOCK)
    assert not store.probing(H)
    t[0] += 2.0
    c = await store.claim(H, 0.1, 0.0, None)
    assert c.granted and c.probe and store.probing(H)
    other = await store.claim(H, 0.1, 0.0, None)  # everyone else waits for the probe's answer
    assert other.outcome is Outcome.HOST_NOT_READY and 0 < other.wait <= 0.25
    await store.succeeded(H)
    assert not store.probing(H)
    t[0] += 0.1
    assert (await store.claim(H, 0.1, 0.0, None)).granted  # the success resumed the host
    assert (await store.host_view(H)).blocks == 0
