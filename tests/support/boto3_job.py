"""A boto3 job as a data pipeline runs one: N threads sharing one S3 client, getting objects from the bucket
through the proxy, unsigned. Run as a process of its own (the proxy's env lines in its environment), it
prints one JSON line: GETs that succeeded, each failure's error code, and the seconds the job took.

    python -m tests.support.boto3_job --keys files/a.bin,files/b.bin --gets 600 --threads 200 \\
        --retry-mode standard [--max-attempts 100]

Used by tests/e2e/test_client_refusals.py and bench/boto3_jobs.py (the figures of issue 41).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run(keys: list[str], gets: int, threads: int, mode: str, attempts: int | None) -> dict[str, Any]:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    retries: dict[str, Any] = {"mode": mode}
    if attempts is not None:
        retries["total_max_attempts"] = attempts
    config = Config(
        signature_version=UNSIGNED, retries=retries, max_pool_connections=threads, region_name="us-east-1"
    )
    s3 = boto3.session.Session().client("s3", config=config)
    lock = threading.Lock()
    failures: Counter[str] = Counter()
    ok = 0

    def one(i: int) -> None:
        nonlocal ok
        key = keys[i % len(keys)]
        try:
            s3.get_object(Bucket="commoncrawl", Key=key)["Body"].read()
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", "?"))
            with lock:
                failures[code] += 1
        except Exception as e:  # noqa: BLE001 - any other failure is counted by its type
            with lock:
                failures[type(e).__name__] += 1
        else:
            with lock:
                ok += 1

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(gets)))
    return {"ok": ok, "failures": dict(failures), "seconds": round(time.monotonic() - started, 2)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", required=True, help="comma-separated object keys of the bucket")
    ap.add_argument("--gets", type=int, required=True)
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--retry-mode", default="standard", choices=("standard", "adaptive", "legacy"))
    ap.add_argument("--max-attempts", type=int, default=None, help="botocore's default when left out")
    a = ap.parse_args(argv)
    print(json.dumps(run(a.keys.split(","), a.gets, a.threads, a.retry_mode, a.max_attempts)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
