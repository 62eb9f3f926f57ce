"""Where the tests run and how they run things: the checkout, the interpreter, the ``politeproxy`` command,
system tools, free ports and this machine's address, waiting for a condition and stopping a process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PY = sys.executable
POLITEPROXY = [PY, "-m", "politeproxy"]


def need_tool(name: str) -> str:
    """The path of a system tool; a test fails under CI when it is missing and skips locally."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required under CI (.ci/run installs it)")
        pytest.skip(f"{name} not installed")
    return path


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: every process a test starts ends this way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(pred: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def non_loopback_ip() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # no packet is sent for a UDP connect
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def cache_command(*args: str) -> str:
    """What ``politeproxy cache ARGS...`` prints (its exit status checked): stats and clear in the tests."""
    r = subprocess.run([*POLITEPROXY, "cache", *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout
