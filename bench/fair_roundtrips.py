"""What the fair turn across proxies (issue 27 item 1) costs Redis: commands per grant, and the shares.

``.venv/bin/python bench/fair_roundtrips.py [--seconds 8] [--gap 0.04]`` starts a redis-server, the fake
upstream and two politeproxy processes on that Redis, then floods pipeline x through proxy A and y and z
through proxy B (plain http, 8 requests in flight each) for ``--seconds``. It counts, from the upstream's
arrival log, the slots each pipeline got, and from Redis's ``INFO commandstats`` (reset after a warm-up)
the scripts run and every command (a script's own calls included), per grant, and from ``redis-cli
monitor`` the round trips (commands the proxies sent, not those a script called).
``POLITEPROXY_BENCH_SRC=/path/to/tree`` runs the proxies from another tree (the code before the fair
turn, to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import loadgen  # noqa: E402
from bench.common import DATA_HOST, Bench, log, make_certs, start_politeproxy, start_upstream  # noqa: E402
from tests.support.redis_server import running_redis  # noqa: E402

OWNED = {"A": ["x"], "B": ["y", "z"]}


async def _flood(port: int, name: str, seconds: float, inflight: int) -> None:
    """One pipeline's closed-loop flood through its proxy (``loadgen.run``), its errors said."""
    r = await loadgen.run(
        f"http://{DATA_HOST}/p/{name}/", inflight, seconds, f"http://{name}@127.0.0.1:{port}", None, {}
    )
    if r.get("errors"):
        log(f"{name}: {r['errors']} of its requests failed")


async def _all(ports: dict[str, int], seconds: float) -> None:
    await asyncio.gather(
        *(_flood(ports[proxy], name, seconds, 8) for proxy, names in OWNED.items() for name in names)
    )


def _stats(r: redis.Redis) -> tuple[int, int]:
    cs = r.info("commandstats")
    scripts = sum(int(v["calls"]) for k, v in cs.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return scripts, sum(int(v["calls"]) for v in cs.values())


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--gap", type=float, default=0.04)
    a = p.parse_args(argv)
    with Bench() as b, running_redis() as server:
        up = start_upstream(b, make_certs(b.tmp))
        toml = f'[schedule]\nbackend = "redis"\nredis_url = "{server.url}"\nglobal_rate = "{a.gap}s"\n'
        toml += '[pacing]\nmax_wait = "25s"\n'
        proxies = {name: start_politeproxy(b, up, toml, name=name) for name in OWNED}
        ports = {name: int(px.url.rsplit(":", 1)[1]) for name, px in proxies.items()}
        asyncio.run(_all(ports, 1.0))  # warm: connections open, every pipeline seen
        r = redis.Redis.from_url(server.url)
        r.config_resetstat()
        up.reset()
        mon_path = b.tmp / "monitor.txt"
        with open(mon_path, "wb") as mon_out:
            mon = subprocess.Popen(["redis-cli", "-p", str(server.port), "monitor"], stdout=mon_out)
            try:
                asyncio.run(_all(ports, a.seconds))
                scripts, commands = _stats(r)
            finally:
                mon.terminate()
                mon.wait(10)
        lines = mon_path.read_text(errors="replace").splitlines()
        sent = [line for line in lines if line[:1].isdigit()]  # a script's own calls say "lua]"
        trips = sum(1 for line in sent if " lua]" not in line and "config" not in line)
        got = Counter(e["path"].split("/")[2] for e in up.log() if e["path"].startswith("/p/"))
    grants = sum(got.values())
    out = (
        f"{grants} grants in {a.seconds:.0f} s at a {a.gap} s gap; shares {dict(sorted(got.items()))}; "
        f"{trips / grants:.2f} round trips, {scripts / grants:.2f} scripts and {commands / grants:.2f} "
        "Redis commands per grant"
    )
    log(out)
    return out


if __name__ == "__main__":
    print(main())
