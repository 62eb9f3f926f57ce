"""System calls per small GET, counted by ``strace -c``: what the kernel side of a relay's CPU is made of.

``.venv/bin/python bench/syscalls.py [--floor] [--squid] [--conc 20] [-n 3000]`` starts the fake upstream,
then each relay (politeproxy with pacing, cache, exempt ceiling and request window off, as
bench/cpu_per_request.py; the floor probe, bench/floor_server.py; Squid with ssl-bump, bench/squid.py),
warms it up with hey, attaches ``strace -c -f`` to it and sends ``-n`` small GETs (1 KiB, keep-alive HTTPS
through the relay) at ``--conc`` clients. Per relay: the calls per answered GET, in all and the most frequent.

Why: instructions (bench/instructions.py) leave the kernel out, and CPU seconds on this shared box move too
much to split. Whether politeproxy's CPU gap to Squid sits in the kernel (more sends, receives, locks or
wake-ups per request) or in user space is a count, not a timing. Under strace a relay runs several times
slower, so its req/s here mean nothing; the calls a GET takes do not change with speed, except the event
loop's waits (fewer ready events per wait when slower). Needs strace (``apt-get install strace``) and hey.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    Bench,
    Proxy,
    log,
    make_certs,
    start_politeproxy,
    start_upstream,
    stop,
    table,
)
from bench.floor_probe import start_floor  # noqa: E402
from bench.heyrun import hey  # noqa: E402
from bench.squid import INSTALL_HINT, squid_path, start_squid  # noqa: E402

TOP = 8  # the most frequent calls shown per relay
# strace -c's table: "% time  seconds  usecs/call  calls  [errors]  syscall"
ROW = re.compile(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def parse(summary: str) -> dict[str, int]:
    """Calls per system call from ``strace -c``'s summary (its total line left out)."""
    out: dict[str, int] = {}
    for line in summary.splitlines():
        m = ROW.match(line)
        if m and m.group(2) != "total":
            out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(1))
    return out


def traced(px: Proxy, out: Path, url: str, n: int, c: int) -> tuple[dict[str, int], int]:
    """``n`` GETs through ``px`` with strace attached to it (and to what it starts): the calls and the
    GETs answered 200."""
    url = url.replace(DATA_HOST, px.host, 1)
    hey(url, px.url, c, n=min(1000, n))  # pools, leaves and the interpreter's warm-up: outside the count
    st = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(px.proc.pid)])
    try:
        time.sleep(1.0)  # attached to every thread before the first GET
        ok = hey(url, px.url, c, n=n, timeout=60).ok
    finally:
        st.terminate()
        st.wait(30)
    return parse(out.read_text(errors="replace")), ok


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--floor", action="store_true", help="count the floor probe too")
    p.add_argument("--squid", action="store_true", help="count Squid with ssl-bump too")
    p.add_argument("--conc", type=int, default=20)
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.conc = 200, 4
    if a.squid and squid_path() is None:
        log(f"syscalls: Squid left out, {INSTALL_HINT}")
        a.squid = False
    url = f"https://{DATA_HOST}/size/1024"
    rows: list[list[str]] = []
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = start_upstream(b, certs)
        starters: list[tuple[str, Callable[[], Proxy]]] = [
            ("politeproxy", lambda: start_politeproxy(b, up, PACING_OFF))
        ]
        if a.floor:
            starters.append(("floor", lambda: start_floor(b, up, certs, 600.0)))
        if a.squid:
            starters.append(("squid", lambda: start_squid(b, up)))
        for name, start in starters:
            px = start()
            try:
                calls, ok = traced(px, b.tmp / f"strace-{name}.txt", url, a.n, a.conc)
            finally:
                stop(px.proc)  # before the next relay starts: they would share the cores
            if ok < a.n:
                log(f"{name}: {a.n - ok} of {a.n} GETs were not answered 200")
            per = max(1, ok)
            top = sorted(calls.items(), key=lambda kv: -kv[1])[:TOP]
            most = ", ".join(f"{k} {v / per:.2f}" for k, v in top)
            rows.append([name, f"{sum(calls.values()) / per:.1f}", most, str(ok)])
    text = f"System calls per small GET (strace -c -f, n={a.n}, {a.conc} clients, keep-alive)\n\n" + table(
        ["relay", "calls per GET", f"the {TOP} most frequent, per GET", "answered 200"], rows
    )
    print("\n" + text)
    return text


if __name__ == "__main__":
    main()
