"""Flags, environment variables and config values that cannot mislead (issue 13 item 5), on a real
`politeproxy run`: a rate flag paces at that rate, a bare number is refused with a hint wherever it is
written, and the effective pace of each class of host is printed at start without -v.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.processes import POLITEPROXY, ROOT, free_port
from tests.support.proxy_proc import NO_ROBOTS
from tests.support.quiet_proxy import Quiet, run_quiet
from tests.support.upstream_proc import Certs, Upstream, start_upstream

HINT = "bare number 5: write 5/s for a rate or 5s for a gap"


@pytest.fixture(scope="module")
def up(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = start_upstream(certs, tmp_path_factory.mktemp("flags-upstream"))
    yield u
    u.stop()


@pytest.fixture(scope="module")
def quiet(up: Upstream, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quiet]:
    """A proxy at --global-rate 10/s, index at 2/s and exempt reads at 40/s, all written as rates."""
    toml = (
        NO_ROBOTS
        + '[schedule]\nbackend = "memory"\n[exempt]\nrate = "40/s"\n'
        + '[hosts."index.commoncrawl.org"]\ninterval = "2/s"\n'
    )
    q = run_quiet(tmp_path_factory.mktemp("quiet"), up, certs, toml, "--global-rate", "10/s")
    yield q
    q.stop()


def test_the_effective_pace_is_printed_at_start_without_v(quiet: Quiet) -> None:
    """One line per paced class of host, each with its gap and its rate, at the default log level."""
    log = quiet.log()
    assert "pacing: all paced hosts together: one grant per 100ms (10/s) (schedule.global_rate)" in log
    assert "pacing: index.commoncrawl.org: one grant per 500ms (2/s) at most" in log
    assert "pacing: exempt range reads: at most 40/s per service, one per 25ms" in log
    assert "Traceback" not in log


def test_a_rate_flag_paces_at_that_rate(quiet: Quiet, up: Upstream) -> None:
    """--global-rate 10/s: eight requests sent at once reach the upstream at most 10 a second: their span
    is at least seven gaps of 100 ms, less one gap of slack for the arrival log's jitter (each request
    opens its own upstream connection, whose TLS set-up delays its arrival by a varying time)."""
    bundle = str(quiet.data_dir / "ca-bundle.pem")
    proxies = {"https": f"http://127.0.0.1:{quiet.port}"}
    tag = f"/size/1?flags={time.monotonic_ns()}"

    def get(i: int) -> int:
        r = requests.get(f"https://data.commoncrawl.org{tag}-{i}", proxies=proxies, verify=bundle, timeout=30)
        return r.status_code

    # One request first: the first upstream connection of a fresh proxy (TLS set-up) would delay the
    # first arrival and shorten the first measured gap.
    assert requests.get(f"https://data.commoncrawl.org/size/1?warm={tag}", proxies=proxies, verify=bundle).ok
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(get, range(8))) == [200] * 8
    times = sorted(a["t"] for a in up.log() if a["path"].startswith(tag))
    assert len(times) == 8
    assert times[-1] - times[0] >= 6 * 0.1, times


def run_cli(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*POLITEPROXY, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POLITEPROXY_DATA_DIR": str(tmp / "d"), **(env or {})},
    )


@pytest.mark.parametrize("where", ["flag", "env", "file"])
def test_a_bare_number_is_refused_with_a_hint(tmp_path: Path, where: str) -> None:
    """`--global-rate 5` used to mean one slot every 5 s, silently. Now it is exit 2 and one line that
    offers both readings, whether it came from the flag, POLITEPROXY_GLOBAL_RATE or the file."""
    args: list[str] = ["run", "--listen", f"127.0.0.1:{free_port()}"]
    env = {}
    if where == "flag":
        args += ["--global-rate", "5"]
    elif where == "env":
        env["POLITEPROXY_GLOBAL_RATE"] = "5"
    else:
        cfg = tmp_path / "c.toml"
        cfg.write_text("[schedule]\nglobal_rate = 5\n")
        args += ["--config", str(cfg)]
    r = run_cli(tmp_path, *args, env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and HINT in lines[0] and "schedule.global_rate" in lines[0], r.stderr
    if where != "file":
        assert "--global-rate or POLITEPROXY_GLOBAL_RATE" in lines[0]
