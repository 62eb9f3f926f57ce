"""Headless chromium (Debian's package) for the status page's tests and the docs' screenshot.

The flags and the process handling are the browser test's (tests/slow/test_status_page_browser.py): one run
bounded in time, in its own session, the whole process group killed at the end, and no lookups of Google's
hosts at start (a machine without internet answers those late or never).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import need_tool

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-proxy-server",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)


def browse(url: str, tmp: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """One chromium run on ``url`` with ``extra`` flags (``--screenshot=FILE``, ``--dump-dom``)."""
    cmd = [need_tool("chromium"), *FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, url]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"chromium did not finish in {timeout:g} s: {err[-2000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers left behind by a finished run
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
