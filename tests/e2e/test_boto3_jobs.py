"""A boto3 job above the budget finishes (issue 41): 200 threads getting objects from the bucket through
the proxy at 20 requests/s with ``pacing.max_wait = "5s"``, so about 10 s of queue.

With the built-in client rules a botocore request may be held 55 s (under botocore's 60 s read timeout), so
the queue carries the job: every GET succeeds, in about the ideal time. Without them (``[clients]
keep_defaults = false``: the 5 s bound for everyone), refusals must carry it: S3's own ``SlowDown`` with a
staggered ``x-amz-retry-after``, which botocore reads as a throttle (5 retry tokens, the adaptive limiter
engaged) instead of a transient error (50 ms, 14 tokens), and an SDK's retry goes ahead of first tries.
Each job runs in a process of its own (tests/support/boto3_job.py) with the proxy's env lines.

botocore's default mode cannot reach the issue's 450 of 600 under a 5 s bound: 200 threads, of which a 5 s
queue at 20/s holds 100, leave 100 threads refused at any moment, each holding 5 of the client's 500 retry
tokens: the whole quota. Every refusal beyond it fails at once (botocore raises when its quota is out), and
a failed thread's next GET is refused again at once. Measured: 270-323 of 600 (bare 503 before: 199).

Timing: the span of the job's GETs at the upstream is asserted against 1.5x the ideal (GETs / rate), as the
issue sets it, and the job's own time against that plus 10 s for its client's start; the box is a noisy
2-core machine, and the ideal already counts every GET at its slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aws import AWS_QUIET, aws_cli
from tests.support.processes import PY, ROOT
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import ProxyFactory, arrivals, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

pytestmark = pytest.mark.slow
pytest.importorskip("boto3")

# The set-up is 20 requests/s with a 5 s bound (POLITEPROXY_JOBS_SCALE=1: the benchmarks page's
# figures, about 5 minutes). The suite runs it SCALE times faster, 40/s with a 2.5 s bound: the same 100
# places in the queue for 200 threads, the same GETs, half the time (faster, the client's own CPU on a
# shared 2-core box would set the pace instead of the proxy).
SCALE = float(os.environ.get("POLITEPROXY_JOBS_SCALE", "2"))
RATE = 20.0 * SCALE  # requests per second: the proxy's global rate
BOUND = 5.0 / SCALE  # pacing.max_wait, seconds
KEYS = [f"files/job{i}.bin" for i in range(50)]


def config(up: Upstream, certs: Certs, keep_defaults: bool) -> str:
    return (
        NO_ROBOTS
        + f'[schedule]\nbackend = "memory"\nglobal_rate = "{RATE:g}/s"\n'
        + f'[pacing]\nmax_wait = "{BOUND:g}s"\nretries = 0\n[cache]\nenabled = false\n'
        + f"[clients]\nkeep_defaults = {'true' if keep_defaults else 'false'}\n"
        # 200 TLS handshakes at once on a shared 2-core box: more than the default 10 s for the slowest
        + '[client]\nhandshake_timeout = "30s"\n'
        + upstream_toml(up, certs)
    )


@pytest.fixture(scope="module")
def job_files(module_files_dir: Path, module_files_upstream: Upstream) -> Upstream:
    for k in KEYS:
        (module_files_dir / k.removeprefix("files/")).write_bytes(b"x" * 1024)
    return module_files_upstream


# The jobs without the rules first: the suite starts with this file (suite_order.py), beside the other
# longest files and the type check and docs build of make test's first minute; the timed jobs (the rules'
# 1.5x-ideal bound) then run after that start, not in it (one clean-clone run took 23.2 s against 22.5 so).
@pytest.fixture(scope="module", params=[False, True], ids=["no-rules", "client-rules"])
def job_proxy(
    request: pytest.FixtureRequest, module_proxy_factory: ProxyFactory, job_files: Upstream, certs: Certs
) -> Iterator[ProxyProc]:
    p = module_proxy_factory(None, config(job_files, certs, request.param))
    yield p
    p.stop()


def job(p: ProxyProc, gets: int, mode: str, attempts: int | None) -> dict[str, object]:
    env = {**p.env, **AWS_QUIET}
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(k, None)
    args = ["--keys", ",".join(KEYS), "--gets", str(gets), "--threads", "200", "--retry-mode", mode]
    if attempts is not None:
        args += ["--max-attempts", str(attempts)]
    r = subprocess.run(
        [PY, "-m", "tests.support.boto3_job", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=gets / RATE * 3 + 60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize(
    ("mode", "attempts", "gets"),
    [("standard", None, 600), ("adaptive", 100, 1000)],
    ids=["botocore-defaults", "common-crawl-profile"],
)
def test_a_boto3_job_above_the_budget_finishes(
    job_proxy: ProxyProc, job_files: Upstream, mode: str, attempts: int | None, gets: int
) -> None:
    job_files.reset()
    rules = "keep_defaults = true" in job_proxy.config_path.read_text()
    result = job(job_proxy, gets, mode, attempts)
    print(json.dumps({"rules": rules, "mode": mode, **result}))
    ok, failures, seconds = result["ok"], result["failures"], result["seconds"]
    assert isinstance(ok, int) and isinstance(failures, dict) and isinstance(seconds, float)
    times = sorted(a["t"] for a in arrivals(job_files) if a["path"].startswith("/files/job"))
    assert len(times) <= gets  # never more upstream than the job asked for (refusals never leave)
    assert set(failures) <= {"SlowDown"}, result  # every failure a throttle the SDK read as one
    if rules:
        assert ok == gets, result
        # The queue carried the job: its GETs reached the upstream within 1.5x the ideal, counted where
        # the project's rate tests count (the upstream's arrival log). The job's own time adds its client's
        # start (200 threads and their TLS handshakes, on a box make test shares): 17-18 s alone, up to
        # 25 s in make test's first minute, so it is bounded loosely, as the CLI jobs' below.
        assert times[-1] - times[0] <= 1.5 * gets / RATE, (result, times[-1] - times[0])
        assert seconds <= 1.5 * gets / RATE + 10, result
    elif mode == "adaptive":
        assert ok >= 0.9 * gets, result
    else:  # the retry quota's bound (module docstring): about half at best, a third on a loaded box
        assert ok >= 0.25 * gets, result


CLI_PROCESSES = 4
CLI_KEYS = 150  # per process: 600 GETs in all, 50 at once per process (200 together)


@pytest.fixture(scope="module")
def cli_files(module_files_dir: Path, job_files: Upstream) -> Upstream:
    for n in range(CLI_PROCESSES):
        for i in range(CLI_KEYS):
            (module_files_dir / f"cli{n}-{i:03d}.bin").write_bytes(b"c" * 512)
    return job_files


def test_aws_cli_copies_above_the_budget_finish(
    job_proxy: ProxyProc, cli_files: Upstream, tmp_path: Path
) -> None:
    """``aws s3 cp --recursive`` in 4 processes of 50 transfers each: 600 GETs above the budget."""
    aws = aws_cli()
    cli_files.reset()
    rules = "keep_defaults = true" in job_proxy.config_path.read_text()
    conf = tmp_path / "aws-config"
    conf.write_text("[default]\ns3 =\n  max_concurrent_requests = 50\n")
    env = {**job_proxy.env, **AWS_QUIET, "AWS_CONFIG_FILE": str(conf), "HOME": str(tmp_path)}
    env["PATH"] = "/usr/bin:/bin"
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                aws,
                "s3",
                "cp",
                "--recursive",
                "--no-sign-request",
                "--only-show-errors",
                f"s3://commoncrawl/files/cli{n}/",
                str(tmp_path / f"out{n}"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        for n in range(CLI_PROCESSES)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    seconds = time.monotonic() - started
    copied = sum(len(list((tmp_path / f"out{n}").glob("*.bin"))) for n in range(CLI_PROCESSES))
    errors = [line for _, err in outs for line in err.splitlines() if "error" in line.lower()]
    gets = CLI_PROCESSES * CLI_KEYS
    print(json.dumps({"rules": rules, "cli": True, "ok": copied, "errors": len(errors), "seconds": seconds}))
    assert all("SlowDown" in e for e in errors), errors[:5]  # every failure a throttle the CLI read as one
    if rules:
        assert copied == gets and all(p.returncode == 0 for p in procs), errors[:5]
        assert seconds <= 1.5 * gets / RATE + 10  # + the CLI's start and listing, about 2 s a process
    else:
        assert copied >= 0.75 * gets, (copied, errors[:5])
