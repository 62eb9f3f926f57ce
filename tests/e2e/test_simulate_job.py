"""``politeproxy simulate --job`` against the stand-in (issue 45 item 5): the finish time it prints for a job
is the one a real proxy in front of the fake upstream gives the same job, at a scaled-down rate (one grant
per 20 ms, the index host at most every 100 ms), counted from the upstream's arrival log."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.pacing_clients import start_clients, warm_upstream_pool
from tests.support.processes import POLITEPROXY, ROOT
from tests.support.proxy_proc import NO_ROBOTS
from tests.support.upstream_proc import Upstream

CONFIG = NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "20ms"\n'
CONFIG += '[hosts."index.commoncrawl.org"]\ninterval = "100ms"\n'
JOB = "index=80,warc=400"  # one pipeline (the client address): the index lookups share it with the reads
PATHS = {"index": ("index.commoncrawl.org", "/CC-MAIN-2024-10-index?url=job"), "warc": (
    "data.commoncrawl.org", "/crawl-data/job/segment.warc.gz")}  # fmt: skip


def predicted(tmp: Path) -> dict[str, float]:
    """The last send of each part from the start, as ``simulate --job --json`` prints it (its own process)."""
    cfg = tmp / "job.toml"
    cfg.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLITEPROXY_")}
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    cmd = [*POLITEPROXY, "simulate", "--config", str(cfg), "--job", JOB, "--json"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    report: dict[str, Any] = json.loads(p.stdout)
    return {part["kind"]: part["last_s"] for part in report["parts"]}


@pytest.mark.slow  # 480 paced requests at 50/s: about 10 s
def test_a_job_finishes_on_the_stand_in_when_simulate_says(
    tmp_path: Path, proxy_factory: Any, upstream: Upstream
) -> None:
    expected = predicted(tmp_path)
    proxy = proxy_factory(upstream, CONFIG)
    warm_upstream_pool(proxy.env)  # exempt reads: no slot taken, and the first grants need no TLS handshake
    upstream.reset()
    counts = {
        kind: int(part.split("=")[1]) for kind, part in zip(("index", "warc"), JOB.split(","), strict=True)
    }
    # The simulation's parts keep 4 requests each at the proxy, and its answers take no time; a real answer
    # takes a few ms, more on a busy box, so each part here keeps 8: the proxy's queue never runs dry.
    runs = {
        kind: start_clients([proxy.env], host, counts[kind], 8, path, tmp_path)
        for kind, (host, path) in PATHS.items()
    }
    for run in runs.values():
        run.fire()
    for kind, run in runs.items():
        assert all(r["status"] == 200 for r in run.results()[0]), kind
    times = {
        kind: [a["t"] for a in upstream.log() if a["path"].startswith(path.split("?")[0])]
        for kind, (_h, path) in PATHS.items()
    }
    assert {k: len(v) for k, v in times.items()} == counts
    start = min(min(v) for v in times.values())
    real = {kind: max(v) - start for kind, v in times.items()}
    for kind in counts:
        # Never more than 5 % early: the schedule keeps its slots (a late grant does not move the next), so
        # a job that finished sooner than simulate said would have outrun the budget. Later only loosely: a
        # stall of the box leaves slots unused (10.10 s against 9.48, 6.5 %, in one run of the suite).
        assert real[kind] >= 0.95 * expected[kind], (kind, real, expected)
        assert real[kind] <= 1.15 * expected[kind], (kind, real, expected)
