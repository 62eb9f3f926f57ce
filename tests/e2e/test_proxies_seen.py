"""Proxies announce themselves (issue 27 item 2): two proxies on one data dir each list both in /status and
in ``politeproxy status --all``; one killed (no clean stop, its record stays) drops out once its record is
older than three beats; one stopped cleanly removes its record at once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from politeproxy.policy.heartbeat import BEAT_EVERY, LIVE_FOR
from tests.support.processes import POLITEPROXY, ROOT, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.redis_server import RedisServer, redis_fixture

redis_one = redis_fixture("redis_one", scope="module")


def proxies(p: ProxyProc) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(p.get("/status"))["proxies"]
    return rows


def listens(p: ProxyProc) -> set[str]:
    return {r["listen"] for r in proxies(p)}


def status_all(p: ProxyProc) -> str:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    out = subprocess.run(
        [*POLITEPROXY, "status", "--all", "--admin", p.url], cwd=ROOT, env=env, text=True,
        capture_output=True, timeout=30, check=True,
    )  # fmt: skip
    return out.stdout


@pytest.mark.slow  # three proxy processes and a wait of three beats (6 s) for a killed proxy's record
def test_two_proxies_see_each_other_and_a_dead_one_drops_out(tmp_path: Path) -> None:
    shared = tmp_path / "data"
    a = start_proxy(tmp_path, None, None, NO_ROBOTS, data_dir=shared)
    b = start_proxy(tmp_path, None, None, NO_ROBOTS, data_dir=shared)
    both = {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    try:
        wait_for(lambda: listens(a) == both and listens(b) == both, 10, "both proxies in both /status")
        row = next(r for r in proxies(a) if r["self"])
        assert row["listen"] == f"127.0.0.1:{a.port}" and row["last_beat_s"] <= BEAT_EVERY + 1
        assert str(a.proc.pid) in row["id"] and row["version"]
        text = status_all(a)
        assert f"127.0.0.1:{a.port}" in text and f"127.0.0.1:{b.port}" in text and "(this one)" in text
        assert len(list((shared / "proxies").glob("*.json"))) == 2
        wait_for(lambda: a.metric("politeproxy_proxies_live") == 2, BEAT_EVERY + 2, "the live gauge at 2")
        assert a.metric("politeproxy_fallback_gap_multiplier") == 2  # expected_proxies 1, two live
        b.kill()  # no clean stop: its record stays until it is older than three beats
        t0 = time.monotonic()
        wait_for(lambda: listens(a) == {f"127.0.0.1:{a.port}"}, LIVE_FOR + 6, "the killed proxy gone")
        assert time.monotonic() - t0 >= LIVE_FOR - 2 * BEAT_EVERY - 1  # not at once: it expired
        c = start_proxy(tmp_path, None, None, NO_ROBOTS, data_dir=shared)
        wait_for(lambda: len(listens(a)) == 2, 10, "a third proxy seen")
        c.stop()  # a clean stop removes its record: gone within a beat, not three
        wait_for(lambda: len(listens(a)) == 1, BEAT_EVERY + 2, "the stopped proxy gone")
    finally:
        a.stop()
        b.kill()


@pytest.mark.slow  # a supervisor and two worker processes
def test_each_worker_beats_as_its_own_entry(tmp_path: Path) -> None:
    p = start_proxy(tmp_path, None, None, NO_ROBOTS, args=("--workers", "2"))
    try:
        wait_for(lambda: len(proxies(p)) == 2, 15, "both workers listed")
        doc = json.loads(p.get("/status"))
        pids = {str(w["pid"]) for w in doc["workers"]}
        assert {r["id"].split(":")[1] for r in doc["proxies"]} == pids
        assert {r["listen"] for r in doc["proxies"]} == {f"127.0.0.1:{p.port}"}
    finally:
        p.stop()


@pytest.mark.slow  # two proxy processes
def test_two_proxies_on_one_redis_see_each_other(tmp_path: Path, redis_one: RedisServer) -> None:
    """Separate data dirs, one Redis: the records are Redis's, not the disk's."""
    toml = NO_ROBOTS + f'[schedule]\nbackend = "redis"\nredis_url = "{redis_one.url}"\n'
    toml += f'redis_prefix = "pp-seen-{tmp_path.name[-12:]}:"\n'
    a = start_proxy(tmp_path, None, None, toml)
    b = start_proxy(tmp_path, None, None, toml)
    both = {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    try:
        wait_for(lambda: listens(a) == both and listens(b) == both, 10, "both proxies on Redis")
        assert not (a.data_dir / "proxies").exists()
    finally:
        a.stop()
        b.stop()
