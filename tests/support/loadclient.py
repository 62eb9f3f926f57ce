"""A load client in its own process: GETs through the proxy from the environment, K at a time.

``python -m tests.support.loadclient --n 40 --concurrency 10 PREFIX [PREFIX ...]`` GETs prefix + "0".."N-1"
(the prefixes taken in turn) with requests (HTTPS_PROXY and REQUESTS_CA_BUNDLE from the environment) and
prints one JSON line per request: {"i": i, "url": url, "status": code, "t0": start, "t": completion time,
"retry_after": header, "bytes": body length}, status 0 for a client-side failure (with "error").

``--until FILE`` keeps going (up to --n requests) until FILE exists: paced load for fault tests, where the
proxy may die and come back; a worker whose request failed to connect waits ``--pause`` before the next,
so a dead proxy is not hammered. Lines are flushed as they complete.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

local = threading.local()
out_lock = threading.Lock()


def fetch(url: str, i: int, timeout: float) -> dict[str, object]:
    session = getattr(local, "session", None)
    if session is None:
        session = local.session = requests.Session()
    t0 = time.time()
    try:
        r = session.get(url, timeout=timeout)
        return {
            "i": i,
            "url": url,
            "status": r.status_code,
            "t0": t0,
            "t": time.time(),
            "retry_after": r.headers.get("Retry-After"),
            "bytes": len(r.content),
        }
    except requests.RequestException as e:
        local.session = None  # a broken tunnel is not reused
        return {"i": i, "url": url, "status": 0, "t0": t0, "t": time.time(), "error": str(e)[:200]}


def emit(result: dict[str, object]) -> None:
    with out_lock:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def run_until(args: argparse.Namespace) -> None:
    """Workers take the next index until the stop file appears or --n requests were started."""
    counter = itertools.count()
    take = threading.Lock()

    def worker() -> None:
        while not os.path.exists(args.until):
            with take:
                i = next(counter)
            if i >= args.n:
                return
            result = fetch(f"{args.prefix[i % len(args.prefix)]}{i}", i, args.timeout)
            emit(result)
            if result["status"] == 0:
                time.sleep(args.pause)

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("prefix", nargs="+")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--until", help="keep going until this file exists (at most --n requests)")
    p.add_argument("--pause", type=float, default=0.1, help="after a failed request, with --until")
    args = p.parse_args()
    if args.until:
        run_until(args)
        return
    with ThreadPoolExecutor(args.concurrency) as pool:
        urls = [f"{args.prefix[i % len(args.prefix)]}{i}" for i in range(args.n)]
        for result in pool.map(lambda iu: fetch(iu[1], iu[0], args.timeout), enumerate(urls)):
            emit(result)


if __name__ == "__main__":
    main()
