"""What a second proxy process could give small GETs (issue 15's untried lever, measured before it is built).

``.venv/bin/python bench/two_processes.py [--conc 16] [--rounds 4] [--duration 4]`` starts the fake upstream
and two politeproxy processes on one data dir (pacing off, cache and exempt ceiling off: one shared file
store, as workers behind SO_REUSEPORT would share it), then in alternating rounds drives, with ``hey`` at the
same total concurrency: the upstream directly; one proxy; both proxies at once (half the clients each, the
two ``hey`` runs side by side). Prints requests per second per round and the medians with the ratios
against direct and against one proxy. Both proxies being busy at once is what two workers would be; the load
generator and the upstream share the same two cores, as in bench/small_gets.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    Bench,
    log,
    make_certs,
    start_politeproxy,
    start_upstream,
    table,
)
from bench.heyrun import hey  # noqa: E402
from bench.stats import busy_share, cpu_jiffies  # noqa: E402


def busy_while(f: Callable[[], float]) -> tuple[float, float]:
    """``f()``'s requests per second and the machine's busy share of both cores meanwhile."""
    j0 = cpu_jiffies()
    rps = f()
    return rps, busy_share(j0, cpu_jiffies())


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conc", type=int, default=16, help="total concurrency (split in two for two proxies)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--duration", type=float, default=4.0)
    a = p.parse_args(argv)
    path = "/size/1024"
    with Bench() as b:
        up = start_upstream(b, make_certs(b.tmp))
        data = b.tmp / "shared-data"
        one = start_politeproxy(b, up, PACING_OFF, data_dir=data, name="p1")
        two = start_politeproxy(b, up, PACING_OFF, data_dir=data, name="p2")
        direct = f"https://127.0.0.1:{up.port}{path}"
        via = f"https://{DATA_HOST}{path}"

        def one_proxy() -> float:
            return hey(via, one.url, a.conc, duration=a.duration).rps

        def two_proxies() -> float:
            with ThreadPoolExecutor(2) as ex:
                runs = [ex.submit(hey, via, px.url, a.conc // 2, duration=a.duration) for px in (one, two)]
                return sum(r.result().rps for r in runs)

        def plain() -> float:
            return hey(direct, None, a.conc, duration=a.duration).rps

        paths = [("direct", plain), ("one proxy", one_proxy), ("two proxies, one data dir", two_proxies)]
        for _name, f in paths:  # warm-up: leaves made, pools filled
            f()
        got: dict[str, list[float]] = {}
        busy: dict[str, list[float]] = {}
        for r in range(a.rounds):
            for name, f in paths[r % 3 :] + paths[: r % 3]:
                rps, share = busy_while(f)
                log(f"round {r + 1} c={a.conc} {name}: {rps:.0f} req/s, machine {share:.0%} busy")
                got.setdefault(name, []).append(rps)
                busy.setdefault(name, []).append(share)
    med = {k: statistics.median(v) for k, v in got.items()}
    rows = [
        [k, f"{med[k]:.0f}", f"{min(v):.0f}-{max(v):.0f}", f"{med[k] / med['direct']:.2f}x",
         f"{med[k] / med['one proxy']:.2f}x", f"{statistics.median(busy[k]):.0%}"]
        for k, v in got.items()
    ]  # fmt: skip
    head = ["path", "req/s median", "range", "vs direct", "vs one proxy", "both cores busy"]
    text = f"small GETs, pacing off, total c={a.conc}, {a.rounds} rounds of {a.duration:g} s\n\n"
    text += table(head, rows)
    print(text)
    return text


if __name__ == "__main__":
    main()
