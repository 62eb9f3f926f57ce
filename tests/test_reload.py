"""Tuning without a restart: the achieved rate of a running proxy follows schedule.global_rate in its file,
whether the change is seen by the file watch or applied by SIGHUP; a broken file changes nothing."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import NO_ROBOTS, ProxyProc, Upstream, wait_for
from tests.test_pacing_accuracy import arrival_stats, run_clients, warm_upstream_pool


def set_rate(p: ProxyProc, old: str, new: str, keep_mtime: bool = False) -> None:
    path = p.config_path
    st = os.stat(path)
    text = path.read_text()
    assert f'global_rate = "{old}"' in text
    path.write_text(text.replace(f'global_rate = "{old}"', f'global_rate = "{new}"'))
    if keep_mtime:  # the watch cannot see this change: only SIGHUP applies it
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(path, (st.st_mtime + 2, st.st_mtime + 2))


def phase_rate(p: ProxyProc, up: Upstream, tmp: Path, phase: str, n: int) -> float:
    results = run_clients([p.env], "data.commoncrawl.org", n, 6, f"/size/8?phase={phase}", tmp)
    assert [r["status"] for r in results[0]].count(200) == n
    times = [a["t"] for a in up.log() if f"phase={phase}&" in a["path"]]
    assert len(times) == n
    return arrival_stats(times).rate


def test_global_rate_follows_the_file_and_sighup_and_survives_a_broken_file(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    p = proxy_factory(upstream, NO_ROBOTS + '[schedule]\nglobal_rate = "100ms"\n')
    warm_upstream_pool(p.env)  # exempt reads: no slot taken, and no TLS handshake in the first phase
    # Each phase spans about 2 s, so 100 ms of scheduling noise stays within the 5% tolerance.
    rates = {"start": phase_rate(p, upstream, tmp_path, "start", 21)}

    # The file watch sees the change.
    set_rate(p, "100ms", "25ms")
    wait_for(lambda: "config reloaded (file changed)" in p.log(), 10, "the file-change reload")
    rates["file"] = phase_rate(p, upstream, tmp_path, "file", 81)

    # A broken file: rejected with the key named, and the running settings stay.
    set_rate(p, "25ms", "fast")
    wait_for(lambda: "rejected" in p.log(), 10, "the rejected reload")
    line = next(ln for ln in p.log().splitlines() if "rejected" in ln)
    assert "schedule.global_rate" in line and "keeping the running settings" in line
    assert p.proc.poll() is None and p.healthy()
    rates["broken"] = phase_rate(p, upstream, tmp_path, "broken", 81)

    # SIGHUP applies a change the watch has not noticed (same mtime).
    set_rate(p, "fast", "50ms", keep_mtime=True)
    p.sighup()
    wait_for(lambda: "config reloaded (SIGHUP)" in p.log(), 10, "the SIGHUP reload")
    rates["sighup"] = phase_rate(p, upstream, tmp_path, "sighup", 41)

    want = {"start": 10.0, "file": 40.0, "broken": 40.0, "sighup": 20.0}
    print(
        "\nreload: " + ", ".join(f"{k} {v:.2f}/s (x{v / want[k]:.3f})" for k, v in rates.items()),
        file=sys.stderr,
    )
    for k, v in rates.items():
        assert abs(v / want[k] - 1) <= 0.05, f"{k}: {v:.2f}/s, configured {want[k]:g}/s"
    metrics = p.metrics()
    assert 'politeproxy_config_reloads_total{result="error"} 1.0' in metrics
    assert 'politeproxy_config_reloads_total{result="ok"} 2.0' in metrics
    assert "politeproxy_configured_rate 20.0" in metrics
