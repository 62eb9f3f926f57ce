"""The file store's request windows (``windows/<service>``, ``stores/window_records.py``), and the clocks
their stamps are made of.

A record is stamped with the wall clock's offset from the boot clock when it is written; a reader on the
same boot that finds another offset has seen the wall clock step since, and moves the counts with it, so
a forward step cannot age them (and a step back cannot make them last longer). The folder holds at most
``MAX_WINDOW_FILES`` records: a service beyond them is counted in one shared record (the safe side).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import cache

from politeproxy.policy.window import WindowRule, WindowState, shifted
from politeproxy.stores import datadir, window_records
from politeproxy.stores.file_records import MAX_HOST_FDS, host_file_name
from politeproxy.stores.memory import StateMachine
from politeproxy.stores.window_records import Stamp

MAX_WINDOW_FILES = 256  # services are a handful; a name a client chose must not make files for good
OVERFLOW = "_overflow"  # the one record of every service beyond them ("_" starts no host name)
STEP = 1.0  # a change of the clocks' offset under this is drift or noise, not a step


def boot_clock() -> float:
    """Seconds since boot, suspend included (Linux); the monotonic clock elsewhere."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


@cache
def boot_id() -> int:
    """This boot's id (Linux), 0 when unknown: an offset is only compared within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return int(f.read(64).strip().replace(b"-", b"")[:16], 16)
    except (OSError, ValueError):
        return 0


class FileWindows:
    """The window records, for FileStore; every call is made under the store's flock."""

    sm: StateMachine
    window_dir_fd: int
    window_fds: dict[str, int]
    boottime: Callable[[], float]
    boot: int

    def _stamp(self) -> Stamp:
        now = self.sm.clock()
        return Stamp(now - self.boottime(), self.boot, now)

    def _window_fd(self, rule: WindowRule) -> int:
        name = host_file_name(rule.service)
        fd = self.window_fds.get(name)
        if fd is None:
            while len(self.window_fds) >= MAX_HOST_FDS:  # services are a handful; the bound is a fence
                old = self.window_fds.pop(next(iter(self.window_fds)))
                if old not in self.window_fds.values():  # the overflow record is kept under two names
                    os.close(old)
            try:
                fd = datadir.record(self.window_dir_fd, name, create=False)
            except FileNotFoundError:
                if datadir.count(self.window_dir_fd) >= MAX_WINDOW_FILES:
                    name = OVERFLOW
                    msg = "file store: windows/ holds %d records; the services beyond them share one"
                    self.sm.warn("windows", msg, MAX_WINDOW_FILES)
                fd = self.window_fds.get(name)
                if fd is None:
                    fd = datadir.record(self.window_dir_fd, name, create=True)
                    self.window_fds[name] = fd
            self.window_fds[host_file_name(rule.service)] = fd
        return fd

    def _read_window(self, rule: WindowRule) -> WindowState:
        data = os.pread(self._window_fd(rule), window_records.SIZE, 0)
        state, ok, stamp = window_records.decode_stamped(data)
        if not ok:
            msg = "file store: the window record of %s is not one; treated as empty"
            self.sm.warn("window", msg, rule.service)
        if stamp is not None and abs(step := stamp.step_since(self._stamp())) >= STEP:
            msg = "file store: the wall clock stepped %+.1f s since the window of %s was written: moved"
            self.sm.warn("step", msg, step, rule.service)
            state = shifted(state, step)
        return state

    def _window_known(self, rule: WindowRule) -> bool:
        """Does the record hold a copy written within the window's reach (a mirror, or its own counts)?"""
        stamp = window_records.decode_stamped(os.pread(self._window_fd(rule), window_records.SIZE, 0))[2]
        if stamp is None:
            return False
        now = self._stamp()
        return 0.0 <= now.written - stamp.written - stamp.step_since(now) <= rule.reach

    def _write_window(self, rule: WindowRule, state: WindowState) -> None:
        fd = self._window_fd(rule)
        data = window_records.encode(state, self._stamp())
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
