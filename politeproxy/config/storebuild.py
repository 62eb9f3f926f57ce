"""The schedule store and its hold notes, built from a Config (the composition root's first step).

``make_store`` picks the backend (memory; the data dir with a memory fallback; Redis with the data dir as
its fallback) and ``make_notes`` the place hold notes are shared in; a store the user must fix first is a
one-line StartupError.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from politeproxy.cache.redis_answers import RedisAnswers
from politeproxy.config.loading import Config, env_number
from politeproxy.policy.services import service_key
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import Store, StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.file import FileStore
from politeproxy.stores.file_windows import boot_clock
from politeproxy.stores.heartbeats import Beats, FileBeats, MemoryBeats, RedisBeats
from politeproxy.stores.holdnotes import FileNotes, HoldNotes, MemoryNotes, RedisNotes
from politeproxy.stores.memory import MemoryStore


class StartupError(Exception):
    """The proxy cannot start; the message is one line for the user (exit 2)."""


def wall_clock() -> Callable[[], float]:
    """time.time, shifted by POLITEPROXY_CLOCK_OFFSET seconds (a testing aid for clock skew)."""
    offset = env_number(os.environ, "POLITEPROXY_CLOCK_OFFSET")  # finite and bounded, or ConfigError
    if not offset:
        return time.time
    return lambda: time.time() + offset


def make_store(cfg: Config, on_change: Callable[[Store, bool], None]) -> Store:
    sched = cfg["schedule"]
    backend = sched["backend"]
    clock = wall_clock()
    mult = float(sched["expected_proxies"])
    # A record further ahead than the longest legitimate backoff is treated as now (issue 9 item 12).
    cap = cfg["pacing"]["backoff_cap"]
    if backend == "memory":
        return MemoryStore(max_backoff=cap)  # monotonic: no other process reads its records
    try:
        local: Store = FileStore(cfg.data_dir, clock, max_backoff=cap, boottime=boot_clock)
    except StoreError as e:
        # Never a silent fall back to memory: that paces this process alone and fails open on the
        # budget shared with other proxies and ccrawl. (A lock that cannot be taken, NFS, is the store's.)
        raise StartupError(
            f"data_dir {cfg.data_dir} is not writable ({e}): the shared schedule lives there; fix its "
            'permissions, or set schedule.backend = "memory" to pace this process alone'
        ) from None
    if backend == "file":
        return watching(cfg, FailoverStore(local, MemoryStore(max_backoff=cap), mult, on_change=on_change))
    from politeproxy.stores.redis_store import RedisStore

    primary = RedisStore(
        sched["redis_url"], prefix=sched["redis_prefix"], key_ttl=sched["redis_key_ttl"], max_backoff=cap
    )
    return watching(cfg, FailoverStore(primary, local, mult, on_change=on_change))


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


def make_notes(cfg: Config, store: Store) -> HoldNotes:
    """Hold notes where the schedule is shared: this process, the data dir, or Redis."""
    backend = cfg["schedule"]["backend"]
    if backend == "file":
        return FileNotes(cfg.data_dir)
    client = getattr(getattr(store, "primary", None), "client", None)
    if backend == "redis" and client is not None:
        return RedisNotes(client, cfg["schedule"]["redis_prefix"], time.time)
    return MemoryNotes()


def make_beats(cfg: Config, store: Store) -> Beats:
    """Heartbeats where the schedule is shared, as hold notes are."""
    backend = cfg["schedule"]["backend"]
    if backend == "file":
        return FileBeats(cfg.data_dir)
    client = getattr(getattr(store, "primary", None), "client", None)
    if backend == "redis" and client is not None:
        return RedisBeats(client, cfg["schedule"]["redis_prefix"])
    return MemoryBeats()


def make_index_answers(cfg: Config, store: Store) -> RedisAnswers | None:
    """On the redis store, where kept index answers are shared with proxies of other data dirs (issue 43)."""
    limits = cfg.cache()
    client = getattr(getattr(store, "primary", None), "client", None)
    if (
        cfg["schedule"]["backend"] != "redis"
        or client is None
        or not (limits.enabled and limits.index_answers)
    ):
        return None
    prefix = cfg["schedule"]["redis_prefix"]
    return RedisAnswers(client, prefix, limits.index_redis_max_answer, limits.index_redis_max_size)
