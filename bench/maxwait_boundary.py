"""The max_wait boundary, from outside (issue 25 item 7): is any request held the whole max_wait and then
told to retry in 1 s?

``.venv/bin/python bench/maxwait_boundary.py [--duration 420] [--out FILE] [--quick]`` starts the fake
upstream and politeproxy on its defaults (file store, 5 paced requests a second, max_wait 25 s; robots off,
as the fake upstream has none) and keeps its paced queue full for ``--duration`` seconds: closed-loop HTTPS
clients (CONNECT, TLS with the proxy's CA) in three pipelines, two steady and one that comes and goes
(``--pipelines one``: all in one, the client address), ask for a paced object of data.commoncrawl.org
again as soon as they are answered; a refused client sleeps its Retry-After (at most 5 s, jittered)
first. About 250 clients, so about 125 wait within max_wait at 5/s and every request let into the queue
is let in close to the boundary.

Every answer is recorded (status, the proxy's X-Politeproxy-Wait, the wait seen by the client, Retry-After,
the refusal's reason) into ``--out`` (JSON lines; the proxy's log beside it, ``.proxy.log``), and the
report says how many refusals came only at about max_wait, how many were told Retry-After 1 after a long
hold, and the rate the upstream saw. Everything is on 127.0.0.1; requests are bounded by
``--max-requests`` and time by ``--duration`` plus one max_wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import ssl
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    ROOT,
    Bench,
    log,
    machine_note,
    make_certs,
    percentile,
    start_politeproxy,
    start_upstream,
    table,
)

MAX_WAIT = 25.0  # politeproxy's default pacing.max_wait, which this run keeps
NEAR = 0.5  # a refusal held within this of max_wait counts as "only at max_wait"
LONG_HOLD = 5.0  # a Retry-After of 1 after a hold at least this long is the finding's symptom
# name, clients, (seconds on, seconds off) or None for always on; "" names no pipeline (the client address)
Mix = tuple[tuple[str, int, tuple[float, float] | None], ...]
MIXES: dict[str, Mix] = {
    "three": (("steady-a", 120, None), ("steady-b", 60, None), ("bursty", 70, (20.0, 20.0))),
    "one": (("", 250, None),),
}


@dataclass
class Answer:
    t: float  # seconds from the start when sent
    pipeline: str
    status: str  # "200", "503", or the client's exception name
    held: float  # X-Politeproxy-Wait (NaN when absent)
    seen: float  # seconds from sending to the answer's head, at the client
    retry_after: str
    why: str  # a refusal's first line


class Budget:
    def __init__(self, n: int) -> None:
        self.left = n

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


async def _one(s: aiohttp.ClientSession, url: str, proxy: str, pipe: str, t0: float) -> Answer:
    sent = time.monotonic()
    try:
        async with s.get(url, proxy=proxy) as r:
            body = await r.read()
            why = body.decode(errors="replace").strip().splitlines()[0][:160] if r.status != 200 else ""
            held = float(r.headers.get("X-Politeproxy-Wait", "nan"))
            ra = r.headers.get("Retry-After", "")
            return Answer(sent - t0, pipe, str(r.status), held, time.monotonic() - sent, ra, why)
    except (aiohttp.ClientError, TimeoutError, ValueError, IndexError) as e:
        return Answer(sent - t0, pipe, type(e).__name__, float("nan"), time.monotonic() - sent, "", str(e))


async def _client(
    s: aiohttp.ClientSession, proxy: str, pipe: str, on_off: tuple[float, float] | None, k: int, run: dict
) -> None:
    t0, stop_at, budget = run["t0"], run["stop_at"], run["budget"]
    i = 0
    while time.monotonic() < stop_at:
        if on_off is not None:
            on, off = on_off
            phase = (time.monotonic() - t0) % (on + off)
            if phase >= on:  # this pipeline rests: come back when it is on again
                await asyncio.sleep(on + off - phase + random.uniform(0, 0.5))
                continue
        if not budget.take():
            return
        i += 1
        a = await _one(s, f"https://{DATA_HOST}/size/64?p={pipe}&c={k}&i={i}", proxy, pipe, t0)
        run["answers"].append(a)
        if a.status == "503":
            ra = float(a.retry_after) if a.retry_after.isdigit() else 1.0
            await asyncio.sleep(min(ra, 5.0) * random.uniform(0.5, 1.0))
        elif a.status != "200":
            await asyncio.sleep(1.0)


async def _load(port: int, ca: Path, a: argparse.Namespace) -> list[Answer]:
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = aiohttp.TCPConnector(limit=0, ssl=ctx)
    timeout = aiohttp.ClientTimeout(total=MAX_WAIT + 35)
    t0 = time.monotonic()
    answers: list[Answer] = []
    run = {"t0": t0, "stop_at": t0 + a.duration, "budget": Budget(a.max_requests), "answers": answers}
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        tasks = []
        for name, n, on_off in MIXES[a.pipelines]:
            proxy = f"http://{name}:x@127.0.0.1:{port}" if name else f"http://127.0.0.1:{port}"
            for k in range(max(1, int(n * a.scale))):
                tasks.append(asyncio.create_task(_client(s, proxy, name or "127.0.0.1", on_off, k, run)))
                await asyncio.sleep(0.01)  # spread the CONNECTs and handshakes of the start
        await asyncio.gather(*tasks)
    return answers


def _report(answers: list[Answer], arrivals: list[float], a: argparse.Namespace, head: str) -> str:
    refused = [x for x in answers if x.status == "503"]
    served = [x for x in answers if x.status == "200"]
    others = [x for x in answers if x.status not in ("200", "503")]
    at_max = [x for x in refused if x.held >= MAX_WAIT - NEAR]
    never = [x for x in at_max if "exceeded max_wait" in x.why]  # no slot came before its deadline
    ra1_long = [x for x in refused if x.retry_after == "1" and x.held >= LONG_HOLD]
    ra1_at_max = [x for x in at_max if x.retry_after == "1"]
    late = [x for x in served if x.held > MAX_WAIT]
    held_r = sorted(x.held for x in refused)
    held_s = sorted(x.held for x in served)
    rate, peak = _upstream_rate(arrivals)
    rows = [
        ["answers", str(len(answers))],
        ["served (200)", str(len(served))],
        ["refused (503)", str(len(refused))],
        ["other answers or client errors", str(len(others))],
        ["refused only at max_wait (held >= 24.5 s)", str(len(at_max))],
        ["  of them 'the wait exceeded max_wait' (no slot came)", str(len(never))],
        [
            "  of them the head's slot fell just past its deadline",
            str(len(at_max) - len(never)),
        ],
        ["  of them told Retry-After: 1", str(len(ra1_at_max))],
        [f"told Retry-After: 1 after a hold >= {LONG_HOLD:g} s", str(len(ra1_long))],
        ["served after more than max_wait", str(len(late))],
        ["held before a refusal: median / p99 / max (s)", _q(held_r)],
        ["held before an answer: median / p99 / max (s)", _q(held_s)],
        ["upstream: paced arrivals, rate / most in any 10 s", f"{rate:.2f}/s / {peak}"],
    ]
    reasons: dict[str, int] = {}
    for x in refused:
        key = x.why.split(" would wait")[0].split(" exceeded")[0].split("'s slot came")[0][:60]
        reasons[key] = reasons.get(key, 0) + 1
    worst = sorted(at_max + ra1_long, key=lambda x: -x.held)[:10]
    text = head + "\n\n" + table(["", "count"], rows)
    text += "\n\nRefusals by reason: " + ", ".join(f"{k!r}: {v}" for k, v in sorted(reasons.items()))
    if worst:
        text += "\n\nThe long-held refusals:\n" + "\n".join(json.dumps(asdict(x)) for x in worst)
    return text + "\n"


def _q(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{percentile(xs, 50):.2f} / {percentile(xs, 99):.2f} / {xs[-1]:.2f}"


def _upstream_rate(arrivals: list[float], span: float = 10.0) -> tuple[float, int]:
    """Paced arrivals per second over the run, and the most in any ``span`` seconds (the budget: 5/s;
    arrival times carry the loopback's jitter, so a 1 s window may hold 6)."""
    if len(arrivals) < 2:
        return 0.0, len(arrivals)
    ts = sorted(arrivals)
    peak, j = 0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - span:
            j += 1
        peak = max(peak, i - j + 1)
    return (len(ts) - 1) / (ts[-1] - ts[0]), peak


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=420.0, help="seconds of load (then the queue drains)")
    p.add_argument("--max-requests", type=int, default=40_000, help="a bound on requests sent")
    p.add_argument("--pipelines", choices=sorted(MIXES), default="three", help="the client mix (see MIXES)")
    p.add_argument("--scale", type=float, default=1.0, help="clients per pipeline, as a fraction of 250")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "maxwait_boundary.jsonl")
    p.add_argument("--quick", action="store_true", help="30 s at a fifth of the clients (a smoke run)")
    a = p.parse_args(argv)
    if a.quick:
        a.duration, a.scale = 30.0, 0.2
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with Bench() as bench:
        certs = make_certs(bench.tmp)
        up = start_upstream(bench, certs)
        pp = start_politeproxy(bench, up, verbose=True)  # -v: the access log, kept beside the records
        log(f"max_wait boundary: {a.duration:.0f} s of load through politeproxy at {pp.url}")
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        answers = asyncio.run(_load(pp.port, pp.ca_file, a))
        arrivals = [float(x["t"]) for x in up.log() if x["path"].startswith("/size/")]
        for f in bench.tmp.glob("politeproxy-*.log"):
            a.out.with_suffix(".proxy.log").write_bytes(f.read_bytes())
    a.out.write_text("".join(json.dumps(asdict(x)) + "\n" for x in answers))
    head = (
        f"Machine: {machine_note()}; started {started}; {a.duration:.0f} s of load, pipelines {a.pipelines}"
    )
    head += f"; records in {a.out}"
    text = _report(answers, arrivals, a, head)
    print(text)
    return text


if __name__ == "__main__":
    main()
