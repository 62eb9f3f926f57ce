"""config/storebuild.py (issue 44 item 4): ``schedule.backend`` is read in one place, and what it builds
comes as one StoreSet: the store, and the hold notes and heartbeats kept where every proxy sharing the
store reads them. Two StoreSets of one config are two proxies: on a shared backend each sees what the
other wrote; memory is one process's own."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from politeproxy.config.loading import build
from politeproxy.config.storebuild import StoreSet, build_stores
from politeproxy.policy.heartbeat import make_beat
from politeproxy.policy.holds import HoldNote
from politeproxy.stores.base import Backend, Store
from tests.support.redis_server import RedisServer, redis_fixture

redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server
H = "data.commoncrawl.org"


def schedule(request: pytest.FixtureRequest, backend: Backend) -> dict[str, Any]:
    sched: dict[str, Any] = {"backend": backend.value, "expected_proxies": 2}
    if backend is Backend.REDIS:
        server: RedisServer = request.getfixturevalue("redis_one")
        sched |= {"redis_url": server.url, "redis_prefix": f"pp-set-{uuid.uuid4().hex[:8]}:"}
    return sched


@pytest.fixture(params=list(Backend))
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[StoreSet, StoreSet]]:
    cfg = build({"data_dir": str(tmp_path), "schedule": schedule(request, request.param)})
    switches: list[tuple[Store, bool]] = []
    a = build_stores(cfg, lambda s, d: switches.append((s, d)))
    b = build_stores(cfg, lambda s, d: switches.append((s, d)))
    yield a, b
    await a.close()
    await b.close()


async def test_one_backend_built_whole(two: tuple[StoreSet, StoreSet]) -> None:
    a, _b = two
    assert a.store.name == a.backend.value and not a.store.degraded
    assert (a.redis is not None) == (a.backend is Backend.REDIS)
    # The live count reaches the failover store of a shared backend: expected_proxies (2) is its floor.
    assert (a.live(1), a.live(5)) == ((2.0, 5.0) if a.backend.shared else (1.0, 1.0))


Two = tuple[StoreSet, StoreSet]


async def test_notes_and_heartbeats_are_kept_where_the_store_is_shared(two: Two) -> None:
    a, b = two
    now = time.time()
    await a.notes.put(HoldNote(H, "block", "403 from CloudFront", 403, now, now + 60, "proxy-a"))
    await a.beats.put(make_beat("proxy-a", "127.0.0.1:1", "x", now, now, {}, []))
    notes, beats = await b.notes.get([H]), await b.beats.read(now)
    if a.backend.shared:
        assert notes[H].by == "proxy-a" and [x.id for x in beats] == ["proxy-a"]
    else:  # the memory backend: one process's own, not another's
        assert notes == {} and beats == []
        assert (await a.notes.get([H]))[H].by == "proxy-a"
