"""``politeproxy simulate`` as a user runs it (issue 24 item 6): the real command in its own process.

- The issue's own example, an hour of ``exempt=50/s,paced=5/s`` through the defaults, ends and every peak it
  prints stays within the limits it prints (the request window's 4,800 and Common Crawl's 6,000).
- The window is what keeps a heavy workload under: with the exempt ceiling raised to 50/s, the same
  workload stays within 4,800 with the window and goes far past 6,000 with ``egress.limit = 0``.
- ``--log`` replays a real proxy's access log (plain and JSON lines, as ``politeproxy run`` writes them):
  every request that went upstream counts, a cache hit does not.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.pacing_clients import tunnel_get
from tests.support.processes import POLITEPROXY, ROOT
from tests.support.proxy_proc import NO_ROBOTS
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
WORKLOAD = "exempt=50/s,paced=5/s"
HANG = 600  # seconds: a guard against a hang, not a speed bound (an hour simulates in seconds)


def simulate(tmp: Path, *args: str, config: str | None = None) -> dict[str, Any]:
    """``politeproxy simulate ... --json`` in a process of its own; its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLITEPROXY_")}
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    cmd = [*POLITEPROXY, "simulate", *args, "--json"]
    if config is not None:
        path = tmp / f"simulate-{len(list(tmp.iterdir()))}.toml"
        path.write_text(config)
        cmd += ["--config", str(path)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG, env=env)
    assert p.returncode == 0, p.stderr
    report: dict[str, Any] = json.loads(p.stdout)
    return report


@pytest.mark.slow  # 198,000 simulated requests: about 7 s of CPU on the 2-core box
def test_an_hour_of_the_issue_workload_stays_within_the_limits_it_prints(tmp_path: Path) -> None:
    r = simulate(tmp_path, "--workload", WORKLOAD, "--duration", "1h")
    data = r["services"][DATA]
    assert r["window_s"] == 300 and r["cc_window_s"] == 300
    assert data["window_limit"] == 4800 and data["cc_limit"] == 6000
    assert data["window_peak"] <= data["window_limit"]
    assert data["cc_peak"] <= data["cc_limit"]
    assert data["offered"] == data["requests"] + data["refused"] == 3600 * 55
    assert 3600 <= r["duration_s"] <= 3600 + 25 + 1  # the last one may wait max_wait
    assert r["over_limit"] == [] and r["over_cc"] == []


@pytest.mark.parametrize(("limit", "within"), [(4800, True), (0, False)], ids=["window", "no-window"])
def test_the_window_is_what_keeps_a_heavy_workload_under(tmp_path: Path, limit: int, within: bool) -> None:
    """The exempt ceiling raised to the workload's own 50/s: only the window stands between it and a block."""
    config = f'[egress]\nlimit = {limit}\n[exempt]\nrate = "50/s"\n'
    data = simulate(tmp_path, "--workload", WORKLOAD, "--duration", "15m", config=config)["services"][DATA]
    if within:
        assert data["window_peak"] <= 4800 and data["refused"] > 0
    else:
        assert data["window_limit"] == 0  # the window is off
        assert data["window_peak"] > 6000 and data["refused"] == 0  # 55/s x 300 s = 16,500


@pytest.mark.parametrize(
    "log_format",
    ["plain", pytest.param("json", marks=pytest.mark.slow)],  # a proxy of its own each: ~2.5 s
)
def test_a_real_proxy_log_replays_as_the_requests_it_sent(
    tmp_path: Path, proxy_factory: Any, upstream: Upstream, log_format: str
) -> None:
    proxy = proxy_factory(upstream, NO_ROBOTS, top_toml=f'log_format = "{log_format}"\n')
    paced = [f"/crawl-data/CC-MAIN-2024-10/sim-{i}.warc.gz" for i in range(6)]
    for path in paced:
        assert tunnel_get(proxy.env, DATA, path)[0] == 200
    assert tunnel_get(proxy.env, DATA, paced[0])[0] == 200  # a cache hit: it never reached the upstream
    for i in range(4):
        status = tunnel_get(proxy.env, DATA, f"/cc-index/table/sim-{i}.parquet", {"Range": "bytes=0-9"})[0]
        assert status in (200, 206)
    proxy.stop()
    assert ('"logger": "politeproxy.access"' in proxy.log()) == (log_format == "json")
    r = simulate(tmp_path, "--log", str(proxy.log_path))
    sent = len([a for a in upstream.log() if a["path"].startswith(("/crawl-data/", "/cc-index/"))])
    assert r["services"][DATA]["requests"] == sent == 10
    assert r["services"][DATA]["refused"] == 0
