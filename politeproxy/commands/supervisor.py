"""``politeproxy run --workers N``: N worker processes on one port, sharing one data dir and one store.

The supervisor serves no request itself. It holds the port (bound with SO_REUSEPORT, never listening: the
port stays this proxy's while a worker restarts, and another proxy's bind fails), starts each worker as
``politeproxy run`` with the same arguments plus ``--workers 1 --listen HOST:PORT``, passes SIGHUP,
SIGTERM and SIGINT on to every worker, and starts a worker that died again: after ``FIRST_DELAY``,
doubling up to ``MAX_DELAY`` while it keeps dying young.

Why the budget holds across workers and across a restart: the schedule, the request windows and the fair
tags live in the shared store (the data dir's files or Redis), which already keeps one budget for several
proxies; a restarted worker claims its slots where the others left off. That is also why the memory store
is refused here (cli.py): it is one process's. The workers find each other through a private folder
(observe/workers.py), so one /metrics or /status answer covers them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from politeproxy.observe.workers import ENV, WorkerSet

STOP_GRACE = 10.0  # seconds a worker has to finish after SIGTERM; then SIGKILL
YOUNG = 10.0  # a worker dying sooner than this after its start waits longer each time before the next
FIRST_DELAY, MAX_DELAY = 0.5, 30.0
TICK = 0.1  # how often the supervisor looks at its workers (a signal wakes it sooner)
EXIT_CONFIG = 2  # a worker's start-up error (StartupError): a restart would meet it again
log = logging.getLogger("politeproxy.workers")
start_log = logging.getLogger("politeproxy.start")  # always at INFO (cli.setup_logging)


def cores() -> int:
    """The cores this process may run on (its affinity, as a container's CPU set limits it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(value: int | str) -> int:
    """The ``workers`` setting as a number: ``auto`` is the number of cores."""
    return cores() if value == "auto" else int(value)


def reserve(host: str, port: int) -> socket.socket:
    """The port, held: a socket bound with SO_REUSEPORT that never listens. A bind without SO_REUSEPORT
    comes first, so a port in use (by any process, a proxy with workers too) is refused, not shared."""
    family, _kind, _proto, _name, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(addr)
        port = int(probe.getsockname()[1])  # port 0: the one the kernel chose
    held = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR for the bind only: it passes the TIME_WAIT connections a previous proxy left on the
        # port (without it the bind failed for a minute after a one-process proxy stopped; issue 45). Off
        # again once bound, so while no worker listens another proxy's probe (above) still meets this one.
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind((addr[0], port, *addr[2:]))
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except BaseException:
        held.close()
        raise
    return held


def _die_with_parent() -> None:
    """In the worker, before exec (Linux): SIGTERM when the supervisor dies, so no worker outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Slot:
    """One worker's place: its process now, when it started, how often it was started again."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    delay: float = FIRST_DELAY
    due: float = 0.0  # when to start it (again)


class Supervisor:
    def __init__(self, argv: list[str], count: int, host: str, port: int) -> None:
        self.argv = argv  # the command line of `run`, repeated for every worker
        self.count = count
        self.host = host
        self.port = port
        self.slots = [Slot(i) for i in range(count)]
        self.stopping = False
        self.hup = False

    def listen_arg(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        """A worker's command line: this one, one worker, on the port held (flags given later win)."""
        one = ["--workers", "1", "--listen", self.listen_arg()]
        return [sys.executable, "-m", "politeproxy", *self.argv, *one]

    def run(self) -> int:
        """Until SIGTERM or SIGINT; 0 after a clean stop, 2 when the workers cannot start at all."""
        try:
            held = reserve(self.host, self.port)
        except OSError as e:
            print(f"politeproxy: cannot listen on {self.host}:{self.port}: {e.strerror}", file=sys.stderr)
            return EXIT_CONFIG
        self.port = int(held.getsockname()[1])
        self.folder = Path(tempfile.mkdtemp(prefix="politeproxy-workers-"))  # mode 0700: this user's only
        old = self._signals()
        try:
            for slot in self.slots:
                self._start(slot)
            start_log.info(
                "politeproxy: %d workers on %s (pids %s)", self.count, self.listen_arg(),
                " ".join(str(s.proc.pid) for s in self.slots if s.proc),
            )  # fmt: skip
            return self._watch()
        finally:
            self._stop_all()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            held.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _signals(self) -> dict[int, signal._HANDLER]:
        def stop(_sig: int, _frame: FrameType | None) -> None:
            self.stopping = True

        def hup(_sig: int, _frame: FrameType | None) -> None:
            self.hup = True

        old: dict[int, signal._HANDLER] = {}
        for sig, handler in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, hup)):
            old[sig] = signal.signal(sig, handler)
        return old

    def _watch(self) -> int:
        while not self.stopping:
            if self.hup:  # a reload: every worker reads the config file again
                self.hup = False
                self._send(signal.SIGHUP)
                start_log.info("politeproxy: SIGHUP passed on to %d workers", self._alive())
            now = time.monotonic()
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    code = self._died(slot, now)
                    if code is not None:
                        return code
                if slot.proc is None and now >= slot.due and not self.stopping:
                    self._start(slot)
            time.sleep(TICK)
        return 0

    def _died(self, slot: Slot, now: float) -> int | None:
        """A worker exited without being asked: schedule its restart; an exit code when all must stop."""
        assert slot.proc is not None
        code, pid = slot.proc.returncode, slot.proc.pid
        slot.proc = None
        if code == EXIT_CONFIG and slot.restarts == 0:
            log.error(
                "worker %d (pid %d) could not start (exit %d): stopping them all", slot.index, pid, code
            )
            return EXIT_CONFIG
        young = now - slot.started < YOUNG
        slot.delay = min(MAX_DELAY, slot.delay * 2) if young else FIRST_DELAY
        slot.due = now + slot.delay
        how = f"signal {-code}" if code < 0 else f"exit {code}"
        log.warning(
            "worker %d (pid %d) died (%s); starting it again in %.1f s", slot.index, pid, how, slot.delay
        )
        slot.restarts += 1
        return None

    def _start(self, slot: Slot) -> None:
        ws = WorkerSet(slot.index, self.count, slot.restarts, self.folder)
        env = {**os.environ, ENV: ws.value()}
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        slot.proc = subprocess.Popen(self.command(), env=env, preexec_fn=preexec)  # noqa: PLW1509 - single-threaded
        slot.started = time.monotonic()
        if slot.restarts:
            log.warning(
                "worker %d started again (pid %d, restart %d)", slot.index, slot.proc.pid, slot.restarts
            )

    def _alive(self) -> int:
        return sum(1 for s in self.slots if s.proc is not None and s.proc.poll() is None)

    def _send(self, sig: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    def _stop_all(self) -> None:
        """SIGTERM to every worker; SIGKILL to any still running after ``STOP_GRACE``."""
        self._send(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) did not stop in time: killed", slot.index, slot.proc.pid)
                slot.proc.kill()
                slot.proc.wait()
