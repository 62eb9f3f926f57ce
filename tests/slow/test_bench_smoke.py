"""The benchmark scripts still run: each with tiny sizes (--quick), without mitmproxy (no PyPI in tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT, need_tool

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

BENCH = ROOT / "bench"


def run(script: str, *args: str, timeout: float = 60) -> str:
    """Run a bench script with --quick. It starts proxies and upstreams of its own: on a timeout the whole
    process group is killed, so a hung run leaves no proxy spinning beside the rest of the suite.

    At nice 10: a benchmark drives its relays as hard as the box allows, and these check only that it runs
    and its report parses, so the suite's timing tests beside it come first for the CPU."""
    env = {**os.environ, "POLITEPROXY_BENCH_CACHE": str(ROOT / ".no-bench-cache")}
    proc = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, str(BENCH / script), "--quick", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script} took over {timeout:g}s:\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{script} failed:\n{out[-3000:]}\n{err[-3000:]}"
    return out


def rows(out: str, first_cell: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith(f"| {first_cell} ")
    ]


def steps(report: str) -> dict[str, str]:
    """run_all.py's report cut into its steps: each step's text ends with its ``_name: N s; ...`` line (a
    step that runs twice, the floor probe's three modes, keeps its texts in order, joined)."""
    out: dict[str, str] = {}
    report = report[report.rindex("Machine: ") :]  # the report, after each step's own printout
    for m in re.finditer(r"(.*?)\n_([\w-]+): \d+ s;[^\n]*", report, re.S):
        out[m.group(2)] = out.get(m.group(2), "") + m.group(1)
    return out


def test_run_all_quick() -> None:
    """The one-run benchmark (issue 28 item 4) with tiny sizes: every target's step runs and its rows parse.
    One process for all of them: cheaper than a script per figure."""
    need_tool("hey")
    need_tool("curl")
    only = "small,bulk,duckdb,held,floor,cpu,workers"
    got = steps(run("run_all.py", "--no-mitm", "--only", only, timeout=120))
    assert set(got) == set(only.split(",")), list(got)
    small = rows(got["small"], "1") + rows(got["small"], "4")
    assert [r[1] for r in small] == ["direct", "politeproxy"] * 2, got["small"]
    assert all(r[-1] == "0" for r in small), got["small"]
    (pp,) = rows(got["bulk"], "politeproxy")
    assert float(pp[1].replace(",", "")) > 0 and float(pp[4]) > 0
    (direct,) = rows(got["duckdb"], "direct")
    (pp,) = rows(got["duckdb"], "politeproxy")
    assert int(direct[3]) > 0 and pp[3] == direct[3]  # the same range reads, all passed through
    assert "| answers | 200: 200 |" in got["held"], got["held"]
    floor = got["floor"]
    assert [r[1] for r in rows(floor, "1")] == ["direct", "floor", "politeproxy"], floor
    assert "| answers after release | 200: 20 |" in floor, floor
    assert "One 8 MiB download" in floor and "| floor |" in floor, floor  # past 64 KiB: a streamed body
    (cpu,) = rows(got["cpu"], "4")
    assert float(cpu[2].split()[0]) > 0, got["cpu"]
    assert [r[1] for r in rows(got["workers"], "4")] == ["direct", "workers=1", "workers=2"], got["workers"]


def test_small_gets_python_loadgen() -> None:
    out = run("small_gets.py", "--no-mitm", "--loadgen", "python", "--mode", "off", "--concurrency", "2")
    assert [r[1] for r in rows(out, "2")] == ["direct", "politeproxy"]


def test_cache_figures_from_duckdb_scan_and_bulk() -> None:
    """Issue 14: duckdb_scan.py --cache reports the second scan with no upstream request, and the cached
    64 MiB object (bulk.py --cache runs the same script) with none either."""
    need_tool("curl")
    out = run("duckdb_scan.py", "--cache", timeout=180)
    (second,) = rows(out, "proxy, second scan")
    scan_direct = rows(out, "direct")[0]  # the first table's direct row (the object's is the second)
    assert second[-1] == "0" and int(scan_direct[-1]) > 0, out
    (hit,) = rows(out, "proxy, cached (hit)")
    assert hit[-1] == "0", out


def test_pacing() -> None:
    # Memory and Redis only: the file store's accuracy is tests/slow/test_pacing_accuracy.py's subject, and
    # its four more proxies took this smoke run past a minute beside a CPU burner (make test-repeat).
    out = run("pacing.py", "--store", "memory,redis", timeout=150)
    got = [r for r in rows(out, "memory") + rows(out, "redis") if len(r) == 10]  # not the claim table
    assert len(got) >= 3
    for r in got:
        assert r[-1] == "0", out  # every request answered 200 and seen upstream
        # A smoke run is too short and too noisy for a lower bound (a loaded box starts late); a ratio far
        # above 1 would mean the budget was exceeded, which no load can excuse.
        assert 0 < float(r[5]) < 1.1, out
    assert "Store claim latency" in out


def test_beside_squid() -> None:
    """Issue 44's benchmark beside Squid with ssl-bump: both relays answer every small GET, download and held
    request through their own CAs, and the targets' table is printed. Squid is the benchmark's own set-up
    (make bench-squid-setup), not the tests': without it this skips, under CI too."""
    need_tool("curl")
    need_tool("hey")
    sys.path.insert(0, str(ROOT))
    from bench.squid import squid_path

    if squid_path() is None:
        pytest.skip("no Squid with ssl-bump (make bench-squid-setup)")
    out = run("beside_squid.py", timeout=180)
    small = rows(out, "2") + rows(out, "4")
    assert [r[1] for r in small] == ["politeproxy", "squid"] * 2, out
    for r in small:
        assert float(r[2].replace(",", "")) > 0 and float(r[4]) > 0 and r[-1] == "0", out
    for name in ("politeproxy", "squid"):
        (b,) = [r for r in rows(out, name) if r[0] == name]  # the download's row, not the held one
        assert float(b[1].replace(",", "")) > 0 and float(b[2]) > 0, out
    held = rows(out, "politeproxy (queued)") + rows(out, "squid (in flight)")
    assert [r[3] for r in held] == ["200: 100", "200: 100"], out
    assert "| small GETs, 4 clients, req/s |" in out and "| bulk 8 MiB, MB/s |" in out, out


def test_instructions_per_get() -> None:
    """The deterministic yardstick (bench/instructions.py): politeproxy under callgrind answers both counted
    runs and its user-space instructions per GET come out in a sane range (hundreds of thousands: the two
    TLS legs and the Python path; a count of handshakes or of nothing would fall outside it)."""
    need_tool("hey")
    need_tool("valgrind")  # .ci/run installs it
    out = run("instructions.py", timeout=120)
    (r,) = rows(out, "politeproxy")
    per = float(r[1].rstrip("k").replace(",", "")) * 1e3
    assert 100e3 < per < 5e6 and r[3] == "1.000", out


def test_profile_summary(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.profile_small_gets import summarize

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (a/politeproxy/server.py:1);_write (x/site-packages/aiohttp/http_writer.py:9) 3\n"
        "main (a/politeproxy/server.py:1) 1\n"
    )
    text = summarize(raw, 5)
    assert "75.0% | `aiohttp/http_writer.py:_write`" in text
    assert "100.0% | `politeproxy/server.py:main`" in text


@pytest.mark.parametrize(
    "script",
    [
        "run_all.py",
        "profile_small_gets.py",
        "loadgen.py",
        "two_processes.py",
        "floor_probe.py",
        "workers.py",
        "beside_squid.py",
        "instructions.py",
        "syscalls.py",
    ],
)
def test_help(script: str) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
