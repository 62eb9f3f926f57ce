"""Start-up faults end in one line and exit 2, never a traceback or a proxy that runs with pacing off.

Real ``python -m politeproxy run`` processes: non-finite or negative config values and environment
numbers, a corrupt CA file, a data dir that cannot be written (a read-only mount, which stops root too,
and a path under a regular file). Also the App's own tasks: awaited at close, gauge errors logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from politeproxy.config.loading import build
from tests.support.processes import POLITEPROXY, ROOT, free_port

RUN_TIMEOUT = 30.0


def run_until_exit(tmp: Path, *args: str, prefix: tuple[str, ...] = (), **env: str) -> tuple[int, str]:
    """Run the command; a process still running after RUN_TIMEOUT started when it should not have."""
    penv = {k: v for k, v in os.environ.items() if not k.startswith("POLITEPROXY_")}
    penv.update(XDG_DATA_HOME=str(tmp / "xdg"), **env)
    proc = subprocess.Popen(
        [*prefix, *POLITEPROXY, *args], cwd=ROOT, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the proxy started and ran: {err.decode(errors='replace')[-2000:]}")
    return proc.returncode, err.decode(errors="replace") + out.decode(errors="replace")


def assert_one_line(rc: int, text: str, *needles: str) -> str:
    lines = text.strip().splitlines()
    assert rc == 2, text
    assert "Traceback" not in text, text
    assert len(lines) == 1, text
    assert lines[0].startswith("politeproxy: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_args(tmp: Path, cfg: Path | None = None, data_dir: Path | None = None) -> list[str]:
    args = ["run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data_dir or tmp / "data")]
    return args + (["--config", str(cfg)] if cfg else [])


BAD_NUMBERS = [
    ('[schedule]\nglobal_rate = "nan"\n', "schedule.global_rate"),
    ("[schedule]\nglobal_rate = nan\n", "schedule.global_rate"),  # a TOML float, not a string
    ('[schedule]\nglobal_rate = "inf"\n', "schedule.global_rate"),
    ("[schedule]\nglobal_rate = 1e400\n", "schedule.global_rate"),  # TOML reads this as inf
    ('[schedule]\nglobal_rate = "1e400"\n', "schedule.global_rate"),
    ('[schedule]\nglobal_rate = "-1"\n', "schedule.global_rate"),
    ('[pacing]\nmax_wait = "-3"\n', "pacing.max_wait"),
    ("[pacing]\nbackoff_cap = inf\n", "pacing.backoff_cap"),
    ("[pacing]\nbackoff_jitter = nan\n", "pacing.backoff_jitter"),
    ("[client]\nidle_timeout = -1\n", "client.idle_timeout"),
    ('[hosts."data.commoncrawl.org"]\ninterval = "nan"\n', "hosts.data.commoncrawl.org.interval"),
    ('[robots]\nttl = "99999999h"\n', "robots.ttl"),
]


# Each case starts two interpreters (run, check-config): the first two stay in the quick run, the rest
# (the same path with other keys and spellings) are slow, and make test runs them all.
@pytest.mark.parametrize(
    ("text", "key"), [*BAD_NUMBERS[:2], *(pytest.param(*c, marks=pytest.mark.slow) for c in BAD_NUMBERS[2:])]
)
def test_non_finite_or_negative_config_refuses_to_start(tmp_path: Path, text: str, key: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    line = assert_one_line(*run_until_exit(tmp_path, *run_args(tmp_path, cfg)), key, str(cfg))
    # check-config says the same line, with the same exit code.
    rc, out = run_until_exit(tmp_path, "check-config", str(cfg))
    assert rc == 2 and out.strip() == line


BAD_ENV = [
    ("POLITEPROXY_GLOBAL_RATE", "nan"),
    ("POLITEPROXY_GLOBAL_RATE", "-1"),
    ("POLITEPROXY_CLOCK_OFFSET", "nan"),
    ("POLITEPROXY_CLOCK_OFFSET", "1e400"),
    ("POLITEPROXY_RATE_WINDOW", "inf"),
    ("POLITEPROXY_RATE_WINDOW", "soon"),
]


# One interpreter each: one case per variable stays in the quick run, the other spellings are slow.
@pytest.mark.parametrize(
    ("name", "value"),
    [c if i % 2 == 0 else pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(BAD_ENV)],
)
def test_non_finite_environment_numbers_refuse_to_start(tmp_path: Path, name: str, value: str) -> None:
    rc, out = run_until_exit(tmp_path, *run_args(tmp_path), **{name: value})
    assert_one_line(rc, out, name)


def test_global_rate_flag_nan_refuses_to_start(tmp_path: Path) -> None:
    rc, out = run_until_exit(tmp_path, *run_args(tmp_path), "--global-rate", "nan")
    assert_one_line(rc, out, "global_rate")


def make_ca(tmp: Path, data_dir: Path) -> None:
    rc, out = run_until_exit(tmp, "ca", "--data-dir", str(data_dir))
    assert rc == 0, out


def test_corrupt_ca_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    d = tmp_path / "data"
    make_ca(tmp_path, d)
    (d / "ca.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\ngarbage\x00\xff\n-----END CERTIFICATE-----\n")
    assert_one_line(*run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d)), str(d))
    # `env` and `ca` read the same CA: the same kind of line, no traceback.
    assert_one_line(*run_until_exit(tmp_path, "env", "--data-dir", str(d)), str(d))


def test_corrupt_ca_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    d = tmp_path / "data"
    make_ca(tmp_path, d)
    (d / "ca-key.pem").write_bytes(os.urandom(64))
    assert_one_line(*run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d)), str(d))


def test_data_dir_under_a_regular_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """ENOTDIR stops root as well as anyone (this case already gave one line; kept as a guard)."""
    (tmp_path / "afile").write_text("not a directory")
    d = tmp_path / "afile" / "sub"
    assert_one_line(*run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d)), str(d))


def read_only_prefix(d: Path, bind: bool) -> tuple[str, ...]:
    """A command prefix that runs the proxy with ``d`` read-only.

    chmod does not stop root, so as root the proxy runs in its own mount namespace (``unshare -m``)
    where ``d`` is a read-only mount: writes fail with EROFS for root too, and the mount vanishes with
    the process. ``bind`` keeps what ``d`` holds (a read-only bind mount); else an empty read-only tmpfs.
    """
    if os.geteuid() != 0:
        d.chmod(0o500)
        return ()
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is needed to make a read-only mount as root")
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode(errors='replace').strip()}")
    if bind:
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    else:
        script = 'mount -t tmpfs -o ro,size=1m tmpfs "$1" && shift && exec "$@"'
    return (unshare, "-m", "sh", "-c", script, "sh", str(d))


def test_read_only_empty_data_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    prefix = read_only_prefix(d, bind=False)
    rc, out = run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d), prefix=prefix)
    assert_one_line(rc, out, str(d), "writable")


def test_read_only_data_dir_with_a_ca_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The CA loads from a read-only dir, but leaves and the schedule could not be written: refused."""
    d = tmp_path / "ro"
    make_ca(tmp_path, d)
    prefix = read_only_prefix(d, bind=True)
    rc, out = run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d), prefix=prefix)
    assert_one_line(rc, out, str(d), "writable")


# -- the App's own tasks ----------------------------------------------------------------------------


def app_config(tmp: Path) -> object:
    return build(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "data_dir": str(tmp / "data"),
            "schedule": {"backend": "memory"},
        }
    )


def test_close_cancels_and_awaits_every_task(tmp_path: Path) -> None:
    """App.close cancels its tasks and awaits them before it closes the parts they use (the proxy, the
    pacer, the store): when the proxy's close begins, none of them is still pending."""
    from politeproxy.app import App

    async def main() -> tuple[list[bool], list[bool]]:
        cfg = tmp_path / "c.toml"
        cfg.write_text("")
        app = App(app_config(tmp_path), str(cfg))  # type: ignore[arg-type]
        await app.start()
        tasks = list(app._tasks)
        # the gauge refresh and the config watch, and any later background task (the status history)
        assert {"gauges", "config watch"} <= {t.get_name() for t in tasks}, tasks
        assert app.proxy is not None
        real_close = app.proxy.close
        seen: list[bool] = []

        async def close_proxy() -> None:
            seen.extend(t.done() for t in tasks)
            await real_close()

        app.proxy.close = close_proxy  # type: ignore[method-assign]
        await app.close()
        return seen, [t.done() for t in tasks]

    when_proxy_closes, after = asyncio.run(main())
    assert when_proxy_closes and all(when_proxy_closes)
    assert after and all(after)


@pytest.mark.slow  # watches the 1 s gauge refresh for 5 s
def test_gauge_refresh_errors_are_logged_once_and_the_loop_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that fails to answer the gauge's read is one warning line (not one a second), and the
    refresh keeps running: once the store answers again, the gauge is set."""
    from politeproxy.app import App

    async def main() -> tuple[int, float]:
        app = App(app_config(tmp_path))  # type: ignore[arg-type]
        await app.start()
        real, snapshot = app.store.host_view, app.pacer.snapshot
        calls = 0

        async def failing(host: str) -> object:
            nonlocal calls
            calls += 1
            raise RuntimeError("store unreachable")

        app.store.host_view = failing  # type: ignore[method-assign]
        # the gauge loop refreshes the hosts the pacer's snapshot names
        named = lambda: replace(snapshot(), hosts=frozenset({"data.commoncrawl.org"}))  # noqa: E731
        app.pacer.snapshot = named  # type: ignore[method-assign]
        await asyncio.sleep(3.5)
        app.store.host_view = real  # type: ignore[method-assign]
        await asyncio.sleep(1.5)
        value = app.metrics.backoff.labels("data.commoncrawl.org")._value.get()
        await app.close()
        return calls, value

    with caplog.at_level(logging.WARNING, logger="politeproxy"):
        calls, value = asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "gauge refresh failed" in r.getMessage()]
    assert calls >= 2, calls  # it kept trying
    assert len(lines) == 1 and "RuntimeError: store unreachable" in lines[0], lines
    assert value == 0.0


def test_schedule_file_that_cannot_be_opened_is_one_line_not_memory_pacing(tmp_path: Path) -> None:
    """ratelimit.lock that cannot be opened read-write (here: a directory) refuses the start with one
    line; pacing this process alone in memory would fail open on the budget shared with other proxies."""
    d = tmp_path / "data"
    make_ca(tmp_path, d)
    (d / "ratelimit.lock").mkdir()
    rc, out = run_until_exit(tmp_path, *run_args(tmp_path, data_dir=d))
    assert_one_line(rc, out, "ratelimit.lock", 'schedule.backend = "memory"')


def test_metrics_address_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    make_ca(tmp_path, tmp_path / "data")  # so the only line is the error (no "made a new CA")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, out = run_until_exit(tmp_path, *run_args(tmp_path), "--metrics-listen", f"127.0.0.1:{port}")
    assert_one_line(rc, out, f"cannot serve metrics on 127.0.0.1:{port}")
