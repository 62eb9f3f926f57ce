"""schedule.redis_url (issue 13 item 5): a wrong scheme is a config error at check-config and at run
(exit 2, one line naming the key, never a traceback), the password can come from POLITEPROXY_REDIS_URL,
and a start-up probe names the Redis address with the password masked, reachable or not, without -v.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.processes import POLITEPROXY, ROOT, free_port
from tests.support.quiet_proxy import run_quiet
from tests.support.redis_server import RedisServer, running_redis

SECRET = "s3cretPW"


def cli(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*POLITEPROXY, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POLITEPROXY_DATA_DIR": str(tmp / "d"), **(env or {})},
    )


def assert_refused(r: subprocess.CompletedProcess[str], *names: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and SECRET not in r.stderr
    for name in names:
        assert name in lines[0], lines[0]


@pytest.mark.slow  # two CLI processes: ~2 s
def test_a_wrong_scheme_in_the_file_fails_check_config_and_run(tmp_path: Path) -> None:
    """It used to pass check-config and end run in a traceback. (More wrong URLs, in process:
    tests/unit/config/test_overrides_and_paths.py.)"""
    url = f"http://:{SECRET}@redis:6379/0"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[schedule]\nbackend = "redis"\nredis_url = "{url}"\n')
    assert_refused(
        cli(tmp_path, "check-config", str(cfg)), "schedule.redis_url", "redis://, rediss:// or unix://"
    )
    run = cli(tmp_path, "run", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}")
    assert_refused(run, "schedule.redis_url")


def test_a_wrong_scheme_from_the_environment_fails_too(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[schedule]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n')
    env = {"POLITEPROXY_REDIS_URL": f"https://:{SECRET}@redis:6379/0"}
    assert_refused(
        cli(tmp_path, "check-config", str(cfg), env=env), "schedule.redis_url", "POLITEPROXY_REDIS_URL"
    )
    run = cli(tmp_path, "run", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}", env=env)
    assert_refused(run, "POLITEPROXY_REDIS_URL")


REDIS_TOML = '[robots]\nenabled = false\n[schedule]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:1/0"\n'


@pytest.mark.slow  # a proxy waiting on a Redis that never answers: ~2 s
def test_an_unreachable_redis_is_named_at_start(tmp_path: Path) -> None:
    """Nothing listens there: one warning names the address (password masked), the proxy still starts
    (it paces on the local schedule until Redis answers), and no traceback is printed."""
    port = free_port()
    env = {"POLITEPROXY_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{port}/0"}
    q = run_quiet(tmp_path, None, None, REDIS_TOML, env=env)
    try:
        log = q.log()
        assert f"WARNING politeproxy: redis at redis://:***@127.0.0.1:{port}/0 is unreachable" in log, log
        assert SECRET not in log and "Traceback" not in log
        assert requests.get(f"http://127.0.0.1:{q.port}/healthz", timeout=5).ok
    finally:
        q.stop()


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[RedisServer]:
    with running_redis() as server:
        import redis

        redis.Redis(port=server.port).config_set("requirepass", SECRET)
        yield server


def test_a_reachable_redis_is_named_with_the_password_masked(
    tmp_path: Path, redis_with_password: RedisServer
) -> None:
    """The password comes from POLITEPROXY_REDIS_URL (not the file); the start line names the address
    with it masked, at the default log level."""
    port = redis_with_password.port
    env = {"POLITEPROXY_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{port}/0"}
    q = run_quiet(tmp_path, None, None, REDIS_TOML, env=env)
    try:
        log = q.log()
        assert f"politeproxy.start: redis at redis://:***@127.0.0.1:{port}/0 is reachable" in log, log
        assert SECRET not in log and "unreachable" not in log
    finally:
        q.stop()


@pytest.mark.slow  # a third proxy start; the masking is the same as the unreachable test's
def test_a_wrong_password_is_reported_as_unreachable(
    tmp_path: Path, redis_with_password: RedisServer
) -> None:
    port = redis_with_password.port
    env = {"POLITEPROXY_REDIS_URL": f"redis://:wrong{SECRET}@127.0.0.1:{port}/0"}
    q = run_quiet(tmp_path, None, None, REDIS_TOML, env=env)
    try:
        log = q.log()
        assert f"redis at redis://:***@127.0.0.1:{port}/0 is unreachable (AuthenticationError" in log, log
        assert SECRET not in log and "Traceback" not in log
    finally:
        q.stop()
