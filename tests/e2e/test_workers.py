"""``politeproxy run --workers 2``: one budget across the workers and another proxy on the data dir, one
/metrics answer for the whole proxy, and a supervisor that passes reload and stop on and restarts a worker
that dies (issue 28 item 3). Counted from the fake upstream's arrival log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.measure import budget_report, over_budget, results, run_load
from tests.support.pacing_clients import read_lock, start_clients, warm_upstream_pool
from tests.support.processes import POLITEPROXY, ROOT, free_port, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
RATE = 50.0
CONFIG = NO_ROBOTS + '[schedule]\nglobal_rate = "20ms"\n'  # 50/s, the file store (the default)
# The sliding-window check's tolerance: grants up to 0.2 s (ten slots) late. Two workers, a second proxy
# and three client processes share two cores with make test's other workers; a grant handed out late can be
# followed by the next one on time (the schedule is kept), which packs more arrivals into one window: 58
# (0.16 s late) in one full run of the suite on 2026-12-07, against 0.1 s's 56. The checks of the schedule
# below and any burst of eleven or more still fail it.
LATE = 0.2
WARMUP = 5  # arrivals left out of the rate fit: the first grants pay the upstream connects
# The fitted rate over the run's ~2.9 s cannot tell a fast schedule from lateness that shrinks as the run
# goes on (early grants late while three clients start, later ones on time): DRIFT seconds of it read as
# DRIFT / 2.9 s over the rate. A CI run fitted 50.33/s (0.66 %: ~19 ms) where 0.5 % was allowed, so the
# fit tolerates 30 ms (~1 %); the shared lock's record checks the schedule itself, without jitter.
DRIFT = 0.03


def fitted_rate(times: list[float]) -> float:
    """Arrivals per second as the least-squares slope of arrival index over time: the schedule's rate.
    (n - 1) / span would hang on its two end points, each a few ms of jitter; the fit averages them out,
    and the window check beside it still catches any burst."""
    ts = sorted(times)
    n = len(ts)
    mt, mi = sum(ts) / n, (n - 1) / 2
    cov = sum((t - mt) * (i - mi) for i, t in enumerate(ts))
    var = sum((t - mt) ** 2 for t in ts)
    return cov / var


def status(p: ProxyProc) -> dict[str, Any]:
    return json.loads(p.get("/status"))


def both_up(p: ProxyProc) -> None:
    """/healthz answers once one worker is up; the tests want both."""
    wait_for(lambda: all(w["answering"] for w in status(p)["workers"]), 20, "both workers up")


def data_arrivals(up: Upstream) -> list[float]:
    return sorted(a["t"] for a in up.log() if a["host"] == DATA and a["path"].startswith("/size/"))


@pytest.mark.slow  # a rate: three proxy processes and three clients, 3 s of load at 50/s
def test_two_workers_and_a_second_proxy_keep_one_budget_and_one_scrape_counts_them(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    a = proxy_factory(upstream, CONFIG, data_dir=shared, args=("--workers", "2"))
    b = proxy_factory(upstream, CONFIG, data_dir=shared)
    both_up(a)
    for env in (a.env, a.env, b.env):
        warm_upstream_pool(env)  # exempt range reads: no slot, no grant
    upstream.reset()
    n = 50  # each of three clients: 150 grants, 3 s of load at 50/s
    clients = start_clients([a.env, a.env, b.env], DATA, n, 6, "/size/16", tmp_path)  # two via a, one via b
    clients.fire()
    answered = clients.results()
    assert all(r["status"] == 200 for got in answered for r in got), answered

    times = data_arrivals(upstream)
    assert len(times) == 3 * n
    over = over_budget(times, RATE, 1.0, LATE)
    assert over is None, f"{over}; {budget_report(times, RATE)}"
    fitted = times[WARMUP:]
    rate = fitted_rate(fitted)
    print(f"\nworkers=2 + a proxy: n={len(times)} fitted rate {rate:.3f}/s ({rate / RATE:.4f})")
    assert rate <= RATE * (1 + DRIFT / (fitted[-1] - fitted[0])), rate  # strict: the budget, DRIFT aside
    # The one schedule in the shared file: every grant of the three processes claimed one slot of it, and
    # its next slot lies a slot per grant past the first, which arrived no earlier than its own slot.
    nxt, count = read_lock(shared)
    assert count == len(times), (count, len(times))
    assert nxt / 1e9 >= times[0] + len(times) / RATE - LATE, (nxt / 1e9 - times[0], len(times) / RATE)
    # loose: the queue never ran dry (0.976 was seen in CI and 0.979 beside a helper's suite: a loaded box)
    assert rate >= 0.9 * RATE, rate

    # One scrape of a gives both workers' grants, each labelled, with the host label: they add up to what
    # reached the upstream through a (every request that arrived and was not b's).
    text = a.metrics()
    per_worker = {
        w: a_metric(text, "politeproxy_grants_total", f'host="{DATA}"', f'worker="{w}"') for w in ("0", "1")
    }
    b_grants = b.metric("politeproxy_grants_total", f'host="{DATA}"')
    assert all(v > 0 for v in per_worker.values()), per_worker  # the kernel spread the connections
    assert sum(per_worker.values()) + b_grants == len(times), (per_worker, b_grants, len(times))
    assert sum(per_worker.values()) == 2 * n and b_grants == n
    assert a_metric(text, "politeproxy_workers", 'state="answering"') == 2
    doc = status(a)
    assert [w["answering"] for w in doc["workers"]] == [True, True]
    assert doc["overall"]["grants_since_start"] == 2 * n  # the whole proxy: both workers' grants


def a_metric(text: str, name: str, *labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if not line.startswith("#") and key.split("{", 1)[0] == name and all(x in key for x in labels):
            total += float(value)
    return total


@pytest.mark.slow  # a worker killed under load and started again: its restart takes seconds
def test_reload_and_stop_reach_every_worker_and_a_killed_one_is_restarted_within_the_budget(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    a = proxy_factory(upstream, CONFIG, args=("--workers", "2"))
    both_up(a)
    first = status(a)["workers"]
    pids = [w["pid"] for w in first]
    assert len(set(pids)) == 2 and all(w["answering"] for w in first), first

    a.mark_log()
    a.sighup()
    wait_for(lambda: a.log_since().count("config reloaded (SIGHUP)") == 2, 10, "both workers reloaded")

    upstream.reset()
    until = tmp_path / "stop-load"
    load = run_load(a.env, [f"https://{DATA}/size/16?k="], 12, until, timeout=10)
    try:
        wait_for(lambda: len(data_arrivals(upstream)) >= 25, 15, "load flowing")
        killed_at = time.time()
        os.kill(pids[1], signal.SIGKILL)

        def restarted() -> bool:
            try:
                ws = status(a)["workers"]
            except OSError:
                return False
            return ws[1]["answering"] and ws[1]["restarts"] == 1 and ws[1]["pid"] != pids[1]

        wait_for(restarted, 20, "worker 1 started again")
        back_at = time.time()
        wait_for(lambda: len([t for t in data_arrivals(upstream) if t > back_at]) >= 25, 15, "load after")
    finally:
        until.write_text("stop")
        results(load, timeout=30)
    times = data_arrivals(upstream)
    over = over_budget(times, RATE, 1.0, LATE)
    assert over is None, f"{over}; {budget_report(times, RATE, {'kill': killed_at, 'back': back_at})}"

    workers = status(a)["workers"]
    a.mark_log()
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(15) == 0
    assert a.log_since().count("shutting down") == 2
    for w in workers:
        wait_for(lambda pid=w["pid"]: not alive(pid), 5, f"worker pid {w['pid']} gone")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # two workers and a headless browser
def test_the_terminal_view_and_the_status_page_show_each_worker(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    a = proxy_factory(upstream, CONFIG, args=("--workers", "2"))
    both_up(a)
    pids = [str(w["pid"]) for w in status(a)["workers"]]
    view = subprocess.run(
        [*POLITEPROXY, "status", "--admin", a.url], cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert view.returncode == 0, view.stderr
    part = view.stdout.split("workers (the lines above are their sum)")[1]
    rows = [line for line in part.splitlines() if "answering" in line]
    assert len(rows) == 2 and all(any(pid in row for row in rows) for pid in pids), view.stdout

    from tests.support.chromium import browse  # needs chromium (skips without): imported where used

    dom = browse(a.url + "/", tmp_path, "--virtual-time-budget=4000", "--dump-dom").stdout
    part_tag = re.search(r'<section id="workers-part"([^>]*)>', dom)
    assert part_tag and "hidden" not in part_tag.group(1), dom[-3000:]  # shown: this proxy has workers
    body = re.search(r'<tbody id="workers">(.*?)</tbody>', dom, re.S)
    assert body and body.group(1).count("<tr>") == 2, dom[-3000:]
    assert all(f'<td class="n">{pid}</td>' in body.group(1) for pid in pids), body.group(1)
    assert body.group(1).count(">answering</td>") == 2, body.group(1)


def test_workers_refuse_the_memory_store(tmp_path: Path) -> None:
    """The memory store is one process's: two workers on it would each keep a budget of their own."""
    cfg = tmp_path / "mem.toml"
    cfg.write_text('[schedule]\nbackend = "memory"\n')
    done = subprocess.run(
        [*POLITEPROXY, "run", "--config", str(cfg), "--data-dir", str(tmp_path / "d"), "--workers", "2",
         "--listen", f"127.0.0.1:{free_port()}"],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "the memory store is one process's" in done.stderr, done.stderr


@pytest.mark.slow  # two workers, one killed and started again: its restart takes seconds
def test_after_a_worker_restart_the_merged_grant_count_dropped_the_dead_workers_grants(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Issue 42, item 11: 129 sent, 109 shown after a restart. Each worker writes its count to the
    workers' folder every second, and its next life carries it: the merged count stays what was sent."""
    a = proxy_factory(upstream, CONFIG, args=("--workers", "2"))
    both_up(a)
    n = 40
    for i in range(n):  # a connection each: the kernel spreads them over both workers
        assert (
            requests.get(f"http://{DATA}/size/1?g={i}", proxies={"http": a.url}, timeout=30).status_code
            == 200
        )
    rows = status(a)["workers"]
    assert sum(w["grants_since_start"] for w in rows) == n, rows
    victim = max(rows, key=lambda w: w["grants_since_start"])
    assert victim["grants_since_start"] > 0
    time.sleep(1.5)  # CARRY_EVERY (1 s) and a margin: the count is on disk before the kill
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> bool:
        try:
            ws = status(a)["workers"]
        except OSError:
            return False
        w = ws[victim["worker"]]
        return (
            w["answering"]
            and w["restarts"] == 1
            and w["pid"] != victim["pid"]
            and all(x["answering"] for x in ws)
        )

    wait_for(restarted, 20, "the killed worker started again")
    doc = status(a)
    assert doc["overall"]["grants_since_start"] == n, doc["workers"]
    assert doc["workers"][victim["worker"]]["grants_since_start"] == victim["grants_since_start"]


def test_workers_start_on_the_port_a_one_process_proxy_just_left(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Issue 45: after a one-process proxy stopped with connections open, `run --workers 2` on its port
    failed with "Address already in use" for about a minute (the connections' TIME_WAIT, which the
    supervisor's held socket did not pass). It starts now, at once."""
    import socket

    first = proxy_factory(upstream, CONFIG)
    clients = [socket.create_connection(("127.0.0.1", first.port), timeout=10) for _ in range(3)]
    for c in clients:  # each connection served once and kept open
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
    first.stop()  # the proxy closes them first: TIME_WAIT on its port
    for c in clients:
        while c.recv(4096):
            pass
        c.close()
    second = proxy_factory(
        upstream, CONFIG, port=first.port, args=("--workers", "2"), data_dir=first.data_dir
    )
    assert second.proc.poll() is None, second.log()
    both_up(second)
