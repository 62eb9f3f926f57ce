"""The schedule store and what is kept beside it, built from a Config (the composition root's first step).

``build_stores`` is the one place ``schedule.backend`` is read: it picks the backend (memory; the data dir
with a memory fallback; Redis with the data dir as its fallback) and returns, in one ``StoreSet``, the
schedule store with the hold notes and heartbeats kept where it is shared, and the Redis client when there
is one (the start-up probe, the kept index answers). Nothing else looks inside the failover store. A store
the user must fix first is a one-line StartupError. Adding a backend: docs/architecture.md, "Stores".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from politeproxy.cache.redis_answers import RedisAnswers
from politeproxy.config.loading import Config, env_number
from politeproxy.policy.services import service_key
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import Backend, FailoverSide, Store, StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.file import FileStore
from politeproxy.stores.file_windows import boot_clock
from politeproxy.stores.heartbeats import Beats, FileBeats, MemoryBeats, RedisBeats, alone
from politeproxy.stores.holdnotes import FileNotes, HoldNotes, MemoryNotes, RedisNotes
from politeproxy.stores.memory import MemoryStore

if TYPE_CHECKING:  # redis-py is imported with the Redis store only: 0.1 s off every other start
    import redis.asyncio as aioredis


class StartupError(Exception):
    """The proxy cannot start; the message is one line for the user (exit 2)."""


def wall_clock() -> Callable[[], float]:
    """time.time, shifted by POLITEPROXY_CLOCK_OFFSET seconds (a testing aid for clock skew)."""
    offset = env_number(os.environ, "POLITEPROXY_CLOCK_OFFSET")  # finite and bounded, or ConfigError
    if not offset:
        return time.time
    return lambda: time.time() + offset


@dataclass(frozen=True)
class StoreSet:
    """One backend's parts, built together: the schedule store the pacer paces on, the hold notes and the
    heartbeats kept where every proxy sharing it reads them, the Redis client (None off Redis), and
    ``live``: what the heartbeats' count of live proxies is told to (the failover store's ``note_live``,
    which answers the gap multiplier its fallback paces with)."""

    backend: Backend
    store: Store
    notes: HoldNotes
    beats: Beats
    redis: aioredis.Redis | None = None
    live: Callable[[int], float] = alone

    async def close(self) -> None:
        """The store closes its own connections (the Redis client is the Redis store's)."""
        await self.store.close()


def build_stores(cfg: Config, on_change: Callable[[Store, bool], None]) -> StoreSet:
    """The backend ``schedule.backend`` names, with everything kept beside it; ``on_change`` hears a
    failover store switch between its two stores."""
    sched = cfg["schedule"]
    backend = Backend(sched["backend"])
    clock = wall_clock()  # a bad POLITEPROXY_CLOCK_OFFSET is refused whatever the backend
    # A record further ahead than the longest legitimate backoff is treated as now (issue 9 item 12).
    cap = cfg["pacing"]["backoff_cap"]
    if backend is Backend.MEMORY:  # monotonic: no other process reads its records
        return StoreSet(backend, MemoryStore(max_backoff=cap), MemoryNotes(), MemoryBeats())
    local = _file_store(cfg, clock, cap)
    mult = float(sched["expected_proxies"])
    if backend is Backend.FILE:
        store = watching(cfg, FailoverStore(local, MemoryStore(max_backoff=cap), mult, on_change=on_change))
        return StoreSet(
            backend, store, FileNotes(cfg.data_dir), FileBeats(cfg.data_dir), live=store.note_live
        )
    from politeproxy.stores.redis_store import RedisStore

    primary = RedisStore(
        sched["redis_url"], prefix=sched["redis_prefix"], key_ttl=sched["redis_key_ttl"], max_backoff=cap
    )
    prefix, client = sched["redis_prefix"], primary.client
    store = watching(cfg, FailoverStore(primary, local, mult, on_change=on_change))
    notes, beats = RedisNotes(client, prefix, time.time), RedisBeats(client, prefix)
    return StoreSet(backend, store, notes, beats, client, live=store.note_live)


def _file_store(cfg: Config, clock: Callable[[], float], cap: float) -> FailoverSide:
    """The data dir's store: the shared store of the file backend, the fallback of the Redis one."""
    try:
        return FileStore(cfg.data_dir, clock, max_backoff=cap, boottime=boot_clock)
    except StoreError as e:
        # Never a silent fall back to memory: that paces this process alone and fails open on the
        # budget shared with other proxies and ccrawl. (A lock that cannot be taken, NFS, is the store's.)
        raise StartupError(
            f"data_dir {cfg.data_dir} is not writable ({e}): the shared schedule lives there; fix its "
            'permissions, or set schedule.backend = "memory" to pace this process alone'
        ) from None


def watching(cfg: Config, store: FailoverStore) -> FailoverStore:
    """The failover store told the request window from the start, so it mirrors every service's window
    into its fallback before this proxy has sent anything (issue 42 item 2)."""
    egress = cfg["egress"]
    if egress["limit"] > 0:
        store.mirror.watch(
            WindowRule(
                service_key("data.commoncrawl.org"), cfg.egress_name, egress["window"], egress["limit"]
            )
        )
    return store


def make_index_answers(cfg: Config, stores: StoreSet) -> RedisAnswers | None:
    """On the redis store, where kept index answers are shared with proxies of other data dirs (issue 43)."""
    limits = cfg.cache()
    if stores.redis is None or not (limits.enabled and limits.index_answers):
        return None
    prefix = cfg["schedule"]["redis_prefix"]
    return RedisAnswers(stores.redis, prefix, limits.index_redis_max_answer, limits.index_redis_max_size)
