"""Instructions per small GET, counted by valgrind's callgrind: a CPU yardstick a shared box does not move.

``.venv/bin/python bench/instructions.py [TREE ...] [--floor] [--squid] [--conc 20] [-n 600] [--rounds 1]``
starts the fake upstream, then each relay in turn under ``valgrind --tool=callgrind`` with counting off:
politeproxy from each source tree (default: this one; pacing, cache, exempt ceiling and request window off,
as bench/cpu_per_request.py), the floor probe (``--floor``, bench/floor_server.py) and Squid with
ssl-bump (``--squid``, bench/squid.py). Each is warmed up with hey, then counted over ``-n`` small GETs
(1 KiB, keep-alive HTTPS through the relay) at ``--conc`` clients: the user-space instructions of that
process per answered GET, and the ratio to the first relay.

Why: CPU seconds per request on this 2-core VM moved by a third between runs of the same code (the
benchmarks page), so a change of a few percent could not be told from the noise. The count moves 2-3 %
from run to run (how many events one turn of the loop takes varies), less side by side in one run. What it
leaves out: the kernel's share (the sends, receives and the file store's flock, about a fifth of
politeproxy's CPU), and time-dependent paths: under valgrind the relay runs ~50x slower, so a pooled
upstream connection is always past its quiet time, for instance. It ranks changes to the same code; the
CPU-time figures stay the ones the targets name.
Needs valgrind (``apt-get install valgrind``) and hey.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    Bench,
    Proxy,
    Upstream,
    add_python_arg,
    log,
    make_certs,
    start_politeproxy,
    start_upstream,
    table,
    tree_runs,
)
from bench.floor_probe import start_floor  # noqa: E402
from bench.heyrun import hey  # noqa: E402
from bench.squid import INSTALL_HINT, squid_path, start_squid  # noqa: E402

READY = 240.0  # seconds a relay under valgrind may take to start (Python's imports run ~50x slower)
Starter = Callable[[list[str]], Proxy]


def hey_ok(url: str, proxy: Proxy, n: int, c: int) -> int:
    """GETs answered 200 of ``n`` sent through ``proxy`` with hey (which does not verify TLS)."""
    return hey(url, proxy.url, c, n=n, timeout=60).ok  # under valgrind a GET is ~50x slower


def totals(files: list[Path]) -> int:
    """The instructions a callgrind dump counted (its ``totals:`` line; the largest of the files given)."""
    best = 0
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                best = max(best, int(line.split()[1]))
    return best


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, timeout=120, check=False)


def count(name: str, start: Starter, out: Path, url: str, n: int, c: int) -> float:
    """One relay under callgrind, counting only during two runs of hey, of ``n`` and of ``3 n`` GETs: per
    GET the difference over the ``2 n`` GETs between them. Each run of hey opens its own connections, so
    the TLS handshakes (a few hundred thousand instructions each) cancel out."""
    wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/{name}.%p"]
    px = start(wrap)
    got: list[tuple[int, int]] = []
    try:
        url_for = url.replace(DATA_HOST, px.host, 1)
        hey_ok(url_for, px, min(200, n), c)  # the pools and the first leaf: outside the count
        for size in (n, 3 * n):
            control(px.pid, "--zero")
            control(px.pid, "-i", "on")
            ok = hey_ok(url_for, px, size, c)
            control(px.pid, "-i", "off")
            before = set(out.glob(f"{name}.{px.pid}*"))
            control(px.pid, "--dump")
            time.sleep(0.5)
            got.append((totals(sorted(set(out.glob(f"{name}.{px.pid}*")) - before)), ok))
    finally:
        px.proc.terminate()
        px.proc.wait(120)
    return _per_get(name, got, n)


def count_whole(name: str, start: Starter, out: Path, url: str, n: int, c: int) -> float:
    """For a relay callgrind_control cannot reach (Squid drops root for its own user, and vgdb then hangs):
    two processes counted whole, start to exit, each warmed up and then sent ``n`` and ``3 n`` GETs; per GET
    the difference over ``2 n``. Start-up, warm-up, handshakes and shutdown cancel out."""
    got: list[tuple[int, int]] = []
    for size in (n, 3 * n):
        wrap = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/{name}-{size}.%p"]
        if os.geteuid() == 0:  # started as its own user: a process that drops root cannot write its dump
            wrap = ["setpriv", "--reuid=proxy", "--regid=proxy", "--init-groups", *wrap]
        px = start(wrap)
        try:
            url_for = url.replace(DATA_HOST, px.host, 1)
            hey_ok(url_for, px, min(200, n), c)
            ok = hey_ok(url_for, px, size, c)
        finally:
            px.proc.terminate()
            px.proc.wait(300)
        got.append((totals(sorted(out.glob(f"{name}-{size}.{px.pid}*"))), ok))
    return _per_get(name, got, n)


def _per_get(name: str, got: list[tuple[int, int]], n: int) -> float:
    (i1, ok1), (i3, ok3) = got
    if ok1 < n or ok3 < 3 * n:
        log(f"{name}: {n - ok1} and {3 * n - ok3} GETs of the two runs were not answered 200")
    return (i3 - i1) / max(1, ok3 - ok1)


def relays(
    a: argparse.Namespace, b: Bench, up: Upstream, certs: Any, runs: list[tuple[Path, str, str]]
) -> list[tuple[str, Starter]]:
    """What to count, in order: each politeproxy tree on each interpreter (``tree_runs``), then the floor
    probe and Squid when asked."""
    out: list[tuple[str, Starter]] = []
    for i, (src, python, _label) in enumerate(runs):

        def pp(w: list[str], s: Path = src, py: str = python) -> Proxy:
            return start_politeproxy(b, up, PACING_OFF, src=s, wrap=w, ready_within=READY, python=py)

        out.append((f"politeproxy{i}" if len(runs) > 1 else "politeproxy", pp))
    if a.floor:
        out.append(("floor", lambda w: start_floor(b, up, certs, 3600, w, READY)))
    if a.squid and squid_path() is None:
        log(f"instructions: Squid left out, {INSTALL_HINT}")
    elif a.squid:
        out.append(("squid", lambda w: start_squid(b, up, wrap=w, ready_within=READY)))
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="*", type=Path, help="politeproxy source trees (default: this one)")
    p.add_argument("--floor", action="store_true", help="also count the floor probe")
    p.add_argument("--squid", action="store_true", help="also count Squid with ssl-bump")
    add_python_arg(p)
    p.add_argument("--conc", type=int, default=20)
    p.add_argument("-n", type=int, default=400, help="GETs of the shorter counted run (the longer: 3 n)")
    p.add_argument("--rounds", type=int, default=1, help="rounds, each relay once per round")
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.conc, a.rounds = 20, 4, 1
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        text = "instructions: skipped, valgrind is not installed (apt-get install valgrind)"
        print(text)
        return text
    runs = tree_runs(a.trees or [Path(__file__).resolve().parent.parent], a.python)
    url = f"https://{DATA_HOST}/size/1024"
    per: dict[str, list[float]] = {}
    with Bench(keep=bool(os.environ.get("BENCH_KEEP"))) as b:
        certs = make_certs(b.tmp)
        up = start_upstream(b, certs)
        out = b.tmp / "callgrind"
        out.mkdir(mode=0o777)
        out.chmod(0o777)  # Squid writes its dump as its own user (bench/squid.py opens the temp dir to it)
        starters = relays(a, b, up, certs, runs)
        for r in range(a.rounds):
            for name, start in starters if r % 2 == 0 else starters[::-1]:
                how = count_whole if name == "squid" else count
                v = how(name, start, out, url, a.n, a.conc)
                per.setdefault(name, []).append(v)
                log(f"round {r}: {name} {v / 1e3:.0f}k instructions per GET")
    return report(a, runs, [s for s, _ in starters], per)


def report(
    a: argparse.Namespace, runs: list[tuple[Path, str, str]], names: list[str], per: dict[str, list[float]]
) -> str:
    first = min(per[names[0]])
    rows = [[n, f"{min(per[n]) / 1e3:,.0f}k", f"{max(per[n]) / 1e3:,.0f}k", f"{min(per[n]) / first:.3f}"]
            for n in names]  # fmt: skip
    head = (
        f"### User-space instructions per small GET (callgrind), {a.n} and {3 * a.n} GETs at {a.conc}"
        f" clients, {a.rounds} round(s)"
    )
    named = [f"- politeproxy{i if len(runs) > 1 else ''}: {label}" for i, (_t, _py, label) in enumerate(runs)]
    text = "\n".join([head, "", *named, "", table(["relay", "fewest", "most", "ratio to the first"], rows)])
    print(text)
    return text


if __name__ == "__main__":
    main()
