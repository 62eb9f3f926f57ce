"""A store in the data dir, shared by every proxy (and ccrawl) pointed at that dir.

``ratelimit.lock`` holds the global record in ccrawl's format: 16 bytes, big-endian uint64 UnixNano of the
next free slot, then big-endian uint64 count of grants, read and written under ``flock(LOCK_EX)`` held only
for that read and write. Per-host state lives in ``hosts/<host>``, the request windows in ``windows/``, the
pipelines' fair turns in ``fair``, all read and written under the same lock, so one claim checks and
reserves them atomically.

Records are untrusted (ccrawl, a crash, a disk): decoding never raises, and a time no legitimate wait gives
is treated as now (``slots.Bounds``), logged once. Only a name that passes ``valid_hostname`` becomes a
file name; any other name gets a hashed one, never a path.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from politeproxy.policy.backoff import BackoffPolicy, Delay, Kind
from politeproxy.policy.fairclaim import FairAsk, FairState, fair_charge, fair_gate, sane_state
from politeproxy.policy.slots import MAX_BACKOFF, Claim, HostState, Outcome, duration
from politeproxy.policy.window import Relative, WindowRule, WindowState
from politeproxy.stores import datadir, fair_records
from politeproxy.stores.base import (
    FailoverSide,
    HostView,
    StoreBusy,
    StoreError,
    jitter_source,
    other_ceiling,
)
from politeproxy.stores.file_records import (
    GLOBAL,
    HOST,
    MAX_HOST_FDS,
    U64,
    _ns,
    decode_global,
    decode_host,
    encode_host,
    host_file_name,
)
from politeproxy.stores.file_windows import FileWindows, boot_clock, boot_id
from politeproxy.stores.flock import Held, LockWait, lock_holders, locked_by, run_held
from politeproxy.stores.memory import StateMachine


class FileStore(FileWindows, FailoverSide):
    """The schedule in the data dir, shared by every proxy and ccrawl on the machine: one flock'd global
    record, one record per host and one per service window, each decision read, made and written whole
    under the lock. The file backend's shared store, and the Redis backend's fallback."""

    name = "file"

    def __init__(
        self,
        data_dir: Path,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = jitter_source,
        max_backoff: float = MAX_BACKOFF,
        boottime: Callable[[], float] | None = None,
        boot: int | None = None,
    ) -> None:
        self.dir = Path(data_dir)
        self.sm = StateMachine(clock, rand, self.name)
        self.sm.max_backoff = duration(max_backoff, MAX_BACKOFF)
        self.path = self.dir / "ratelimit.lock"
        self.host_dir = self.dir / "hosts"
        self.window_dir = self.dir / "windows"  # one record per service (stores/file_windows.py)
        # The window records' stamps compare ``clock`` with the boot clock: on with the real wall clock
        # (or when both are given, as tests do with virtual ones); a virtual clock alone would look stepped.
        real = boottime is None and clock is time.time
        self.boottime = boot_clock if boottime is None else boottime
        self.boot = (boot_id() if real or boottime is not None else 0) if boot is None else boot
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot make {self.dir}: {e}") from e
        # Checked folders (stores/datadir.py): a symlink planted in place of one is refused.
        self.host_dir_fd = datadir.folder(self.dir, "hosts")
        self.window_dir_fd = datadir.folder(self.dir, "windows")
        try:
            self.fd = datadir.record(None, self.path, shown=self.path)
        except FileNotFoundError as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        datadir.own_only(self.fd, self.path)
        self.host_fds: OrderedDict[str, int] = OrderedDict()
        self.window_fds: dict[str, int] = {}  # one per named service: a handful
        self.fair_fd: int | None = None  # ``fair``: the pipelines' turns (stores/fair_records.py)
        self.lock_timeout = 5.0
        # flock belongs to the open file description, which every coroutine here shares: two of them
        # "holding" it at once would let the first one's unlock end the second one's critical section
        # early. So one coroutine at a time takes the flock.
        self._inproc: asyncio.BoundedSemaphore | None = None  # a lock whose locked() counts waiters too
        # Contended waits run here, never in the default executor (DNS uses that); one at a time.
        self._executor: ThreadPoolExecutor | None = None

    # -- locking: try without blocking the loop; on contention wait in the lock thread -----------------

    def _lock_nb(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as e:  # ENOLCK/EOPNOTSUPP on NFS and friends
            raise StoreError(f"cannot lock {self.path}: {e}") from e

    async def _lock(self) -> None:
        if self._lock_nb():
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="politeproxy-flock")
        wait = LockWait(self.fd, time.monotonic() + self.lock_timeout)
        fut = asyncio.get_running_loop().run_in_executor(self._executor, wait.run)
        try:
            # The thread stops at its own deadline; this bound only covers a thread still finishing the
            # previous (abandoned) wait.
            async with asyncio.timeout(self.lock_timeout + 1.0):
                got = await asyncio.shield(fut)
        except BaseException as e:  # timeout or the waiter cancelled: a late lock must not be kept
            wait.abandon()
            if isinstance(e, (OSError, TimeoutError)):
                raise StoreError(f"cannot lock {self.path}: {e!r}") from e
            raise
        if not got:
            raise StoreBusy(locked_by(self, lock_holders(self.fd)))

    def _unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _held(self) -> Held:
        """The flock, held for one synchronous read-modify-write (``async with self._held(): ...``)."""
        return Held(self)

    # -- records ----------------------------------------------------------------------------------

    def _read_global(self) -> tuple[float, int]:
        data = os.pread(self.fd, GLOBAL.size, 0)
        rec = decode_global(data)
        if rec is None:
            if data:
                self.sm.warn(
                    "short", "file store: %s is %d bytes, not 16; treated as empty", self.path, len(data)
                )
            return 0.0, 0
        return rec

    def _write_global(self, nxt: float, count: int) -> None:
        os.pwrite(self.fd, GLOBAL.pack(_ns(nxt), count & U64), 0)

    def _host_fd(self, host: str, create: bool) -> int | None:
        """The open record of a host; None when it has none yet and ``create`` is false (a view or a
        refused claim of a new name leaves no file behind)."""
        name = host_file_name(host)
        fd = self.host_fds.get(name)
        if fd is not None:
            self.host_fds.move_to_end(name)
            return fd
        try:
            fd = datadir.record(self.host_dir_fd, name, create, shown=self.host_dir / name)
        except FileNotFoundError:
            if create:
                raise
            return None
        while len(self.host_fds) >= MAX_HOST_FDS:
            os.close(self.host_fds.popitem(last=False)[1])
        self.host_fds[name] = fd
        return fd

    def _read_host(self, host: str) -> HostState:
        fd = self._host_fd(host, create=False)
        if fd is None:
            return HostState()
        data = os.pread(fd, HOST.size, 0)
        st = decode_host(data)
        if st is None:
            if data:
                self.sm.warn(
                    "short",
                    "file store: a record in %s is %d bytes, not 40 or 96; treated as empty",
                    self.host_dir,
                    len(data),
                )
            return HostState()
        return st

    def _write_host(self, host: str, st: HostState) -> None:
        # One pwrite of 96 bytes: a kill -9 leaves the old or the new record, never half of each.
        fd = self._host_fd(host, create=True)
        assert fd is not None
        os.pwrite(fd, encode_host(st), 0)

    # -- Store ------------------------------------------------------------------------------------

    async def claim(
        self,
        host: str,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float = 0.0,
        window: WindowRule | None = None,
        fair: FairAsk | None = None,
    ) -> Claim:
        # The read-modify-write, run synchronously under the flock by ``run_held`` (a closure over the
        # claim's arguments).
        def held() -> Claim:
            nxt, count = self._read_global()
            st = self._read_host(host)
            c, new_next, new_st = self.sm.claim(nxt, st, gap, interval, max_wait, not_before)
            turns = None
            if fair is not None and c.granted and duration(gap) > 0:  # the fair turn, under this flock
                now = self.sm.clock()
                turns = self._read_fair(now, duration(gap))
                c = fair_gate(turns, c, fair, duration(gap), now)
                if c.outcome is Outcome.NOT_YOUR_TURN:  # the marks written, nothing reserved
                    self._write_fair(turns)
                    return c
            c, counted = self._windowed(c, window, max_wait)
            if turns is not None and fair is not None:
                if c.granted:
                    fair_charge(turns, fair)
                self._write_fair(turns)
            if not c.granted and c.window:  # the window has no room: nothing reserved, nothing written
                return c
            if c.granted:
                self._write_global(new_next, count + 1)
            elif new_next != nxt:  # a corrupt record, treated as now: write that back
                self._write_global(new_next, count)
            # Granted with a step, or a corrupt record replaced by its sane form; or the host's first grant
            # here: its record is created then, so later reads find it open instead of trying os.open on a
            # missing file per request (a refused claim of a new name still leaves no file).
            changed = new_st is not st and new_st != st
            if changed or (c.granted and host_file_name(host) not in self.host_fds):
                self._write_host(host, new_st)
            self.note_probe(host, c)
            return c

        return await run_held(self, held)

    def _windowed(
        self, c: Claim, rule: WindowRule | None, max_wait: float | None
    ) -> tuple[Claim, WindowState | None]:
        """The claim through the service's window, read and (when granted) written under the flock held."""
        if rule is None or not rule.on or not c.granted:
            return c, None
        c, counted = self.sm.windowed(c, self._read_window(rule), rule, max_wait)
        if counted is not None:
            self._write_window(rule, counted)
        return c, counted

    def _read_fair(self, now: float, gap: float) -> FairState:
        if self.fair_fd is None:
            self.fair_fd = datadir.record(None, self.dir / "fair", shown=self.dir / "fair")
        state, ok = fair_records.decode(os.pread(self.fair_fd, fair_records.MAX_SIZE, 0))
        state, sane = sane_state(state, now, gap)
        if not (ok and sane):
            msg = "file store: %s is not a fair-queuing record; its bad parts dropped"
            self.sm.warn("fair", msg, self.dir / "fair")
        return state

    def _write_fair(self, state: FairState) -> None:
        assert self.fair_fd is not None
        data = fair_records.encode(state)
        os.pwrite(self.fair_fd, data, 0)
        os.ftruncate(self.fair_fd, len(data))

    async def window_used(self, rule: WindowRule) -> int:
        async with self._held():
            return self.sm.window_used(self._read_window(rule), rule)

    async def window_counts(self, rule: WindowRule) -> Relative:
        if not rule.on:
            return ()
        async with self._held():
            return self.sm.window_counts(self._read_window(rule), rule)

    async def mirror_window(self, rule: WindowRule, counts: Relative) -> None:
        if not rule.on:
            return
        async with self._held():
            self._write_window(rule, self.sm.window_mirrored(self._read_window(rule), rule, counts))

    async def window_known(self, rule: WindowRule) -> bool:
        async with self._held():
            return self._window_known(rule)

    async def add_window(self, rule: WindowRule, counts: Relative) -> None:
        if not rule.on:
            return
        async with self._held():
            self._write_window(rule, self.sm.window_mirrored(self._read_window(rule), rule, counts, add=True))

    async def exempt_claim(
        self,
        host: str,
        rate: float,
        burst: int,
        max_wait: float | None,
        hold: bool = True,
        ceiling: str | None = None,
        window: WindowRule | None = None,
    ) -> Claim:
        key = other_ceiling(host, ceiling)

        def held() -> Claim:  # the read-modify-write under the flock, as the paced claim's
            st = self._read_host(host)
            other = None if key is None else self._read_host(key)
            c, new, new_other = self.sm.exempt_claim(st, rate, burst, max_wait, hold, other)
            c, _ = self._windowed(c, window, max_wait)
            if c.granted and new is not st and new != st:
                self._write_host(host, new)
            if c.granted and key is not None and new_other is not None and new_other != other:
                self._write_host(key, new_other)
            self.note_probe(host, c)
            return c

        return await run_held(self, held)

    async def throttled(
        self,
        host: str,
        retry_after: float | None,
        policy: BackoffPolicy,
        kind: Kind = Kind.THROTTLE,
        base: float = 0.0,
    ) -> Delay:
        self.probe_answered(host)
        async with self._held():
            delay, st = self.sm.throttled(self._read_host(host), retry_after, policy, kind, base)
            self._write_host(host, st)
            return delay

    async def mirror_backoff(self, host: str, seconds: float) -> None:
        async with self._held():
            st = self._read_host(host)
            new = self.sm.held(st, seconds)
            if new != st:
                self._write_host(host, new)

    async def succeeded(self, host: str) -> None:
        self.probe_answered(host)
        async with self._held():
            st = self._read_host(host)
            new = self.sm.succeeded(st)
            if new != st:
                self._write_host(host, new)

    async def release(self, host: str) -> None:
        self.probe_answered(host)
        async with self._held():
            if self._host_fd(host, create=False) is None:
                return
            st = self._read_host(host)
            new = self.sm.released(st)
            if new != st:
                self._write_host(host, new)

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        async with self._held():
            self._write_host(host, self.sm.with_crawl_delay(self._read_host(host), delay, ttl))

    async def host_view(self, host: str) -> HostView:
        async with self._held():
            return self.sm.view(self._read_host(host))

    async def grants(self) -> int:
        async with self._held():
            return self._read_global()[1]

    async def close(self) -> None:
        fair = [] if self.fair_fd is None else [self.fair_fd]
        fds = {self.fd, self.host_dir_fd, self.window_dir_fd, *self.host_fds.values()}
        fds |= set(self.window_fds.values())  # the overflow record is kept under several names
        for fd in [*fds, *fair]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.host_fds.clear()
        self.window_fds.clear()
        self.fair_fd = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
