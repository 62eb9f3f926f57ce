"""The supervisor's parts that need no worker: the count, the port it holds, the command it starts."""

from __future__ import annotations

import socket

import pytest

from politeproxy.commands.supervisor import Supervisor, cores, reserve, worker_count
from politeproxy.config.loading import load
from politeproxy.policy.settings import ConfigError


def test_workers_setting_takes_a_count_or_auto() -> None:
    assert load(None, {"workers": "3"})["workers"] == 3
    assert load(None, {"workers": "auto"})["workers"] == "auto"
    assert worker_count("auto") == cores() >= 1 and worker_count(2) == 2
    for bad in ("0", "x", "257", "-1"):
        with pytest.raises(ConfigError, match="workers"):
            load(None, {"workers": bad})


def test_the_held_port_is_shared_with_reuse_port_listeners_only() -> None:
    held = reserve("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # another proxy without SO_REUSEPORT: refused
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen(1)
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass  # connections reach the listening worker, never the held socket
        with pytest.raises(OSError):
            reserve("127.0.0.1", port)  # a second proxy of workers on a held port: refused, not shared
    finally:
        held.close()


def _time_wait(port: int) -> None:
    """Leave TIME_WAIT connections on ``port`` as a one-process proxy does when it stops: its listener has
    SO_REUSEADDR only, and it closes its connections first."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(4)
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        for _ in clients:
            listener.accept()[0].close()
        for c in clients:
            c.recv(1)  # the proxy's FIN: closing now leaves TIME_WAIT on the proxy's side
            c.close()


def test_the_port_is_held_past_a_previous_proxys_time_wait_and_still_refuses_others() -> None:
    """Issue 45: `run --workers 2` failed with "Address already in use" for about a minute after a one-process
    proxy stopped on the port. The port is held at once, and another proxy is still refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _time_wait(port)
    held = reserve("127.0.0.1", port)
    try:
        with socket.socket() as single, pytest.raises(OSError):
            single.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            single.bind(("127.0.0.1", port))  # a one-process proxy (asyncio sets SO_REUSEADDR): refused
        with pytest.raises(OSError):
            reserve("127.0.0.1", port)
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))  # as a worker's server binds (asyncio, reuse_port=True)
            worker.listen(1)
    finally:
        held.close()


def test_a_worker_runs_the_same_command_with_one_worker_on_the_held_port() -> None:
    s = Supervisor(["run", "--config", "c.toml", "--workers", "2", "--listen", "127.0.0.1:0"], 2, "::1", 4000)
    cmd = s.command()
    assert cmd[-4:] == ["--workers", "1", "--listen", "[::1]:4000"]  # the later flags win
    assert cmd[3:5] == ["run", "--config"]
