"""An unwritable data dir (issue 9 item 25): the proxy refuses to start with exit 2 and one line, never a
traceback. Running as root, ``chmod`` stops nothing, so the read-only cases use a read-only bind mount in a
private mount namespace (``unshare -m``); without root they use ``chmod 0555``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import POLITEPROXY, ROOT, free_port

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.faults]


def can_bind_mount() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    r = subprocess.run([unshare, "-m", "true"], capture_output=True, timeout=10)
    return r.returncode == 0


def read_only(data_dir: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``data_dir`` read-only, whoever we are."""
    if os.geteuid() != 0:
        data_dir.chmod(0o555)
        return argv
    if not can_bind_mount():
        if os.environ.get("CI"):
            pytest.fail("running as root without unshare -m: cannot make a read-only data dir")
        pytest.skip("running as root without unshare -m: cannot make a read-only data dir")
    script = 'mount --make-rprivate / && mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(data_dir), *argv]


def run(argv: list[str]) -> tuple[int, list[str]]:
    """Run ``politeproxy run`` without -v; its exit code and its non-empty output lines."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the proxy started on an unwritable data dir and kept running: {out[-2000:]}")
    return proc.returncode, [line for line in out.splitlines() if line.strip()]


def proxy_argv(data_dir: Path) -> list[str]:
    return [*POLITEPROXY, "run", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{free_port()}"]


def assert_refused(code: int, lines: list[str], data_dir: Path) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text, text[-3000:]
    assert code == 2, f"exit {code}: {text[-2000:]}"
    assert len(lines) == 1, f"{len(lines)} lines: {text[-2000:]}"
    assert lines[0].startswith("politeproxy: error:") and str(data_dir) in lines[0], lines[0]


def test_data_dir_under_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    data_dir = tmp_path / "afile" / "data"
    assert_refused(*run(proxy_argv(data_dir)), data_dir)


def test_empty_read_only_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "ro"
    data_dir.mkdir()
    assert_refused(*run(read_only(data_dir, proxy_argv(data_dir))), data_dir)
    assert list(data_dir.iterdir()) == []


def test_read_only_data_dir_that_holds_a_ca(tmp_path: Path) -> None:
    """A CA made earlier (``politeproxy ca``), then the dir went read-only: the schedule cannot be kept in
    ``ratelimit.lock``, where ccrawl and other proxies would share it, so the start is refused."""
    data_dir = tmp_path / "ro-ca"
    made = [*POLITEPROXY, "ca", "--data-dir", str(data_dir)]
    subprocess.run(made, cwd=ROOT, check=True, capture_output=True)
    assert (data_dir / "ca.pem").exists()
    assert_refused(*run(read_only(data_dir, proxy_argv(data_dir))), data_dir)


def test_read_only_data_dir_with_the_redis_backend(tmp_path: Path) -> None:
    """With Redis the data dir holds the fallback store: without it an outage would have nowhere to pace."""
    data_dir = tmp_path / "ro-redis"
    data_dir.mkdir()
    cfg = tmp_path / "redis.toml"
    cfg.write_text('[schedule]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:1/0"\n')
    argv = [*proxy_argv(data_dir), "--config", str(cfg)]
    assert_refused(*run(read_only(data_dir, argv)), data_dir)
