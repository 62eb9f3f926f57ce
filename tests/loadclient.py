"""A load client in its own process: N GETs through the proxy from the environment, K at a time.

``python -m tests.loadclient --n 40 --concurrency 10 URL_PREFIX`` GETs URL_PREFIX + "0".."N-1" with
requests (HTTPS_PROXY and REQUESTS_CA_BUNDLE from the environment) and prints one JSON line per request:
{"i": i, "status": code, "t": completion time}, status 0 for a client-side failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

local = threading.local()


def fetch(prefix: str, i: int, timeout: float) -> dict[str, object]:
    session = getattr(local, "session", None)
    if session is None:
        session = local.session = requests.Session()
    try:
        r = session.get(f"{prefix}{i}", timeout=timeout)
        return {
            "i": i,
            "status": r.status_code,
            "t": time.time(),
            "retry_after": r.headers.get("Retry-After"),
        }
    except requests.RequestException as e:
        return {"i": i, "status": 0, "t": time.time(), "error": str(e)[:200]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("prefix")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()
    with ThreadPoolExecutor(args.concurrency) as pool:
        for result in pool.map(lambda i: fetch(args.prefix, i, args.timeout), range(args.n)):
            sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
