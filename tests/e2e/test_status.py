"""``GET /status``, ``politeproxy status`` and the page at ``/``, against one running proxy (started once for
the module) with paced requests from two pipelines queued behind a 1 s gap.

The proxy and its queued requests: tests.support.live_status.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.support.live_status import GAP, D, Live, start_live, stop_live
from tests.support.processes import POLITEPROXY, ROOT, free_port, wait_for
from tests.support.upstream_proc import Certs


def queued_by(doc: dict[str, Any]) -> dict[str, int]:
    return {p["pipeline"]: p["queued"] for p in doc["pipelines"]}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Live]:
    lv = start_live(tmp_path_factory.mktemp("status"), certs)
    yield lv
    stop_live(lv)


def interactive() -> None:
    """Run in the child before exec: Ctrl-C as a user's shell gives it. A test run started in the background
    (CI, `cmd &` in a script) ignores SIGINT, the child inherits that, and Python then keeps it ignored:
    the --watch processes below would never see their Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.Popen(
        [*POLITEPROXY, "status", *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interactive,
    )  # fmt: skip


def test_status_document_shows_hosts_pipelines_and_overall(live: Live) -> None:
    doc = live.status()
    assert doc["version"] and doc["uptime_s"] >= 0
    o = doc["overall"]
    assert o["configured_rate"] == pytest.approx(1 / GAP) and o["configured_gap_s"] == pytest.approx(GAP)
    assert o["store"] == {"backend": "memory", "active": "memory", "degraded": False}
    assert o["grants_since_start"] >= 1 and o["achieved_rate"] <= 1 / GAP + 0.5
    hosts = {h["host"]: h for h in doc["hosts"]}
    h = hosts[D]
    assert h["state"] == "ok" and h["seconds_left"] == 0
    assert h["effective_interval_s"] == pytest.approx(GAP)  # the global gap bounds every host
    assert h["queued"] == o["queued"] >= 3 and h["exempt_in_flight"] == 0
    assert "index.commoncrawl.org" in hosts  # configured hosts show even when idle
    assert hosts["index.commoncrawl.org"]["queued"] == 0
    rows = {p["pipeline"]: p for p in doc["pipelines"]}
    assert {"alpha", "beta"} <= rows.keys()
    assert sum(r["queued"] for r in rows.values()) == o["queued"]
    a, b = rows["alpha"], rows["beta"]
    assert a["weight"] == 2 and b["weight"] == 1
    assert a["fair_share"] == pytest.approx(2 / 3, abs=0.01) and b["fair_share"] == pytest.approx(
        1 / 3, abs=0.01
    )
    for r in (a, b):
        assert r["next_host"] == D
        # Its own waiters go first, and at most every waiter does, after the slot under way (up to a gap
        # away) and a gap more.
        assert r["queued"] * GAP - 0.01 <= r["expected_wait_s"] <= (o["queued"] + 2) * GAP + 0.01, r
    assert sum(r["grants_last_minute"] for r in rows.values()) >= 1
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0, abs=0.01)
    served = [r for r in rows.values() if r["grants_last_minute"]]
    assert all(r["wait_p50_s"] is not None and r["wait_p50_s"] >= 0 for r in served), served


def on_a_terminal(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``politeproxy status ARGS`` with a pseudo-terminal for its output (as a user runs it); the
    caller reads the terminal's side from the returned descriptor and closes it."""
    master, slave = os.openpty()
    # A terminal tall enough for the whole view: on openpty's default size the pipelines table is below the
    # last row, and a wait for it ran to its timeout (20 s). LINES too: under pytest-xdist the environment
    # the child inherits says LINES=24 (and COLUMNS=80), which rich prefers to the terminal's own size.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 150, 0, 0))
    env = {**os.environ, "COLUMNS": "150", "LINES": "60", "TERM": "xterm"}
    proc = subprocess.Popen(
        [*POLITEPROXY, "status", *args], cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave,
        preexec_fn=interactive,
    )  # fmt: skip
    os.close(slave)
    return proc, master


def read_until(fd: int, want: bytes, count: int, timeout: float) -> bytes:
    out, end = b"", time.monotonic() + timeout
    while out.count(want) < count and time.monotonic() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:  # the other side closed
                break
    return out


def test_cli_view_json_watch_and_one_line_when_nothing_answers(live: Live) -> None:
    """The text view (non-tty), --json, --watch on a pipe and on a terminal stopped by Ctrl-C, and a
    refused connection: five processes at once."""
    top, term = on_a_terminal("--admin", live.proxy.url, "--watch", "--interval", "0.5")
    text = cli("--admin", live.proxy.url)
    js = cli("--admin", live.side, "--json")  # --metrics-listen answers the same
    dead = cli("--admin", f"http://127.0.0.1:{free_port()}")
    watch = cli("--admin", live.proxy.url, "--watch", "--interval", "0.5")
    try:
        out, err = text.communicate(timeout=30)
        assert text.returncode == 0, err
        for word in (D, "index.commoncrawl.org", "alpha", "beta", "configured 1.00/s", "pipelines", "hosts"):
            assert word in out, out
        assert "\x1b" not in out  # not a terminal: no escape sequences
        jout, jerr = js.communicate(timeout=30)
        assert js.returncode == 0, jerr
        assert {"alpha", "beta"} <= set(queued_by(json.loads(jout)))
        dout, derr = dead.communicate(timeout=30)
        assert dead.returncode == 1 and dout == ""
        lines = derr.strip().splitlines()
        assert len(lines) == 1, derr
        assert lines[0].startswith("politeproxy: error: no answer from http://127.0.0.1:"), derr
        # --watch: two frames (one refresh at least), then Ctrl-C ends it with 0 and no traceback.
        assert watch.stdout is not None
        frames, deadline = 0, time.monotonic() + 20
        while frames < 2 and time.monotonic() < deadline:
            frames += watch.stdout.readline().startswith("politeproxy ")
        assert frames >= 2
        watch.send_signal(signal.SIGINT)
        _out, werr = watch.communicate(timeout=10)
        assert watch.returncode == 0 and "Traceback" not in werr, werr
        # On a terminal: a full-screen view redrawn in place (like top), left cleanly on Ctrl-C.
        screen = read_until(term, b"alpha", 2, 20)  # the pipelines table of two frames
        assert screen.count(b"politeproxy 0.1") >= 2 and b"\x1b[?1049h" in screen, screen[-2000:]
        top.send_signal(signal.SIGINT)
        assert top.wait(10) == 0
        rest = read_until(term, b"\x1b[?1049l", 1, 5)
        assert b"\x1b[?1049l" in rest and b"Traceback" not in rest, rest[-2000:]
    finally:
        for proc in (text, js, dead, watch, top):
            if proc.poll() is None:
                proc.kill()
        os.close(term)


def test_status_page_on_both_admin_addresses(live: Live) -> None:
    pages = [requests.get(base + "/", timeout=10) for base in (live.proxy.url, live.side)]
    for r in pages:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
        assert r.headers["Cache-Control"] == "no-store"
    assert pages[0].content == pages[1].content
    html = pages[0].text
    assert 'fetch("status"' in html and '<svg id="chart"' in html
    for outside in ("<script src", "<link", "@import", "url(", "//cdn", "https://"):
        assert outside not in html.lower(), outside
    assert requests.head(live.side + "/status", timeout=10).status_code == 200
    assert requests.post(live.proxy.url + "/status", timeout=10).status_code == 405


def test_status_history_is_a_ring_of_achieved_vs_configured(live: Live) -> None:
    wait_for(lambda: len(live.status()["history"]["points"]) >= 2, 10, "two history points")
    hist = live.status()["history"]
    assert hist["step_s"] == 0.5 and hist["span_s"] == 900
    assert hist["fields"] == ["time", "achieved_rate", "configured_rate", "queued"]
    t_prev = 0.0
    for t, achieved, configured, queued in hist["points"]:
        assert t > t_prev and abs(t - time.time()) < 60
        t_prev = t
        assert configured == pytest.approx(1 / GAP)
        assert 0 <= achieved <= 2 / GAP + 1  # a grant per gap, two at most in a half-second step
        assert queued >= 0
