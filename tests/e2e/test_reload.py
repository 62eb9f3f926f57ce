"""Tuning without a restart: the achieved rate of a running proxy follows schedule.global_rate in its file,
whether the change is seen by the file watch or applied by SIGHUP; a broken file changes nothing."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.pacing_clients import arrival_stats, run_clients, warm_upstream_pool
from tests.support.processes import wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream


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


@pytest.mark.slow  # several reload rounds of the 1 s file watch, rates measured after each
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
    # Each phase's rate is the configured one: never above it (5 %: the phase's first grant may come late,
    # which shortens the span it is counted over), and loosely below it (a loaded box delays grants: 14 %
    # under was seen beside a CPU burner; 0.8 still tells every phase from the one before it).
    for k, v in rates.items():
        assert v / want[k] <= 1.05, f"{k}: {v:.2f}/s, configured {want[k]:g}/s"
        assert v / want[k] >= 0.8, f"{k}: {v:.2f}/s, configured {want[k]:g}/s"
    metrics = p.metrics()
    assert 'politeproxy_config_reloads_total{result="error"} 1.0' in metrics
    assert 'politeproxy_config_reloads_total{result="ok"} 2.0' in metrics
    assert "politeproxy_configured_rate 20.0" in metrics


def rewrite(p: ProxyProc, data: bytes, bump: int) -> None:
    """Write ``data`` as the config file with an mtime the watch cannot miss."""
    st = os.stat(p.config_path)
    p.config_path.write_bytes(data)
    os.utime(p.config_path, (st.st_mtime + bump, st.st_mtime + bump))


def count(p: ProxyProc, needle: str) -> int:
    return sum(needle in ln for ln in p.log().splitlines())


@pytest.mark.slow  # several reload rounds of the 1 s file watch
def test_bad_files_on_reload_are_rejected_and_the_watch_lives_on(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Not UTF-8, empty, and half-written files are each rejected with one line naming why; the running
    settings stay; the file watch still applies a later valid change and logs each changed key."""
    p = proxy_factory(
        upstream, NO_ROBOTS + '[schedule]\nglobal_rate = "100ms"\n', top_toml='log_format = "plain"\n'
    )
    good = p.config_path.read_bytes()
    assert b'global_rate = "100ms"' in good
    bad = {
        "not UTF-8": good.replace(b"100ms", b"100\xff\xfems"),
        "the file is empty": b"",
        "not valid TOML": good[: good.index(b"100ms") + 2],  # cut mid-value, as an editor mid-write leaves it
    }
    for n, (why, data) in enumerate(bad.items(), start=1):
        rewrite(p, data, 2 * n)
        wait_for(lambda n=n: count(p, "rejected") == n, 10, f"the rejected reload ({why})")
        line = [ln for ln in p.log().splitlines() if "rejected" in ln][-1]
        assert why in line and "keeping the running settings" in line, line
        assert "Traceback" not in p.log()
        assert p.proc.poll() is None and p.healthy()
        assert "politeproxy_configured_rate 10.0" in p.metrics()

    # The watch is still alive: a valid change is applied, and the change is logged key by key.
    changed = good.replace(b"100ms", b"50ms").replace(b'"plain"', b'"json"\nintercept_s3_path_style = true')
    rewrite(p, changed, 10)
    wait_for(lambda: "config reloaded (file changed)" in p.log(), 10, "the valid reload after bad ones")
    line = next(ln for ln in p.log().splitlines() if "config reloaded (file changed)" in ln)
    assert "schedule.global_rate: 100ms (10/s) -> 50ms (20/s)" in line, line  # the file's units
    assert "log_format: 'plain' -> 'json'" in line, line
    assert "log_format changed but applies only after a restart" in p.log()
    # It changes the CA's name constraints, which are made at start.
    assert "intercept_s3_path_style changed but applies only after a restart" in p.log()
    metrics = p.metrics()
    assert "politeproxy_configured_rate 20.0" in metrics
    assert 'politeproxy_config_reloads_total{result="error"} 3.0' in metrics
    assert 'politeproxy_config_reloads_total{result="ok"} 1.0' in metrics
