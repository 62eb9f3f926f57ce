"""A successful reload is shown without -v (issue 26 item 2): after a rejected reload the ERROR must not
stay the last line on screen, so the next good reload's line comes at the default level too."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.support.processes import POLITEPROXY, ROOT, free_port, stop_process, wait_for


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_good_reload_after_a_bad_one_is_shown_at_the_default_level(tmp_path: Path) -> None:
    cfg = tmp_path / "pp.toml"
    cfg.write_text('[schedule]\nbackend = "memory"\nglobal_rate = "200ms"\n[robots]\nenabled = false\n')
    port = free_port()
    log = tmp_path / "proxy.log"
    argv = [
        *POLITEPROXY,
        "run",
        "--config",
        str(cfg),
        "--data-dir",
        str(tmp_path / "d"),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # no -v
    try:
        wait_for(lambda: healthy(port), 30, "proxy /healthz")
        cfg.write_text("[schedule\n")  # not TOML
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "rejected" in log.read_text(), 10, "the rejected reload")
        cfg.write_text('[schedule]\nbackend = "memory"\nglobal_rate = "100ms"\n[robots]\nenabled = false\n')
        proc.send_signal(signal.SIGHUP)  # the file watch may see it first: either reload's line will do
        change = "schedule.global_rate: 200ms (5/s) -> 100ms (10/s)"  # in the units of the file
        wait_for(lambda: change in log.read_text(), 10, "the good reload's line without -v")
        line = next(ln for ln in log.read_text().splitlines() if change in ln)
        assert "config reloaded" in line, line
    finally:
        stop_process(proc)
