"""The config file's default place (issue 26 item 4): `politeproxy config path` says where it is looked for,
`politeproxy config init` writes a commented one there (and never replaces one without --force), and
`politeproxy run` reads it from there without --config."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import POLITEPROXY, ROOT, free_port, stop_process, wait_for


def pp(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": ""}
    env.pop("POLITEPROXY_CONFIG", None)
    return subprocess.run(
        [*POLITEPROXY, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def status(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
            doc: dict[str, object] = json.loads(r.read())
            return doc
    except OSError:
        return None


@pytest.mark.slow  # four CLI processes and a proxy: ~3 s
def test_config_init_writes_the_default_file_and_run_reads_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = home / ".config" / "politeproxy" / "politeproxy.toml"
    assert str(path) in pp(home, "config", "path").stdout and "absent" in pp(home, "config", "path").stdout
    assert pp(home, "config", "init").returncode == 0 and path.is_file()
    again = pp(home, "config", "init")
    assert again.returncode == 2 and "--force" in again.stderr  # never replaced by accident
    assert pp(home, "config", "init", "--force").returncode == 0
    port = free_port()
    text = path.read_text()
    text = text.replace('# listen = "127.0.0.1:3128"', f'listen = "127.0.0.1:{port}"')
    text = text.replace('# global_rate = "200ms"', 'global_rate = "100ms"').replace(
        "# [schedule]", "[schedule]"
    )
    path.write_text(text)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": ""}
    env.pop("POLITEPROXY_CONFIG", None)
    argv = [*POLITEPROXY, "run", "--data-dir", str(tmp_path / "data")]  # no --config, no --listen
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: status(port) is not None, 30, "the proxy on the port the default file names")
        doc = status(port)
        assert doc is not None
        overall = doc["overall"]
        assert isinstance(overall, dict) and overall["configured_rate"] == 10.0, overall
        assert doc["config"] == {"path": str(path), "read": True}  # status shows the file read
        assert f"config file: {path}" in log.read_text()  # a start line at the default level names it
    finally:
        stop_process(proc)


@pytest.mark.slow  # a proxy, config init and the 1 s file watch: ~4 s
def test_a_config_file_written_after_start_is_read_like_an_edit(tmp_path: Path) -> None:
    """No file at the default place at start: the start line says so (and where one would be read from);
    one written there later is read by the file watch, a restart-only key in it named as such (issue 45)."""
    home = tmp_path / "home"
    path = home / ".config" / "politeproxy" / "politeproxy.toml"
    port = free_port()
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": ""}
    env.pop("POLITEPROXY_CONFIG", None)
    argv = [*POLITEPROXY, "run", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}"]
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: status(port) is not None, 30, "the proxy")
        assert (
            f"no config file: defaults (a file written at {path} is read when it appears)" in log.read_text()
        )
        doc = status(port)
        assert doc is not None and doc["config"] == {"path": str(path), "read": False}
        assert pp(home, "config", "init").returncode == 0
        text = path.read_text().replace('# global_rate = "200ms"', 'global_rate = "100ms"')
        text = text.replace("# [schedule]", "[schedule]")
        path.write_text('log_format = "json"\n' + text)  # log_format: a key only a restart applies
        wait_for(
            lambda: "config reloaded (file changed)" in log.read_text(), 15, "the reload of the new file"
        )
        lines = log.read_text()
        assert "log_format changed but applies only after a restart" in lines
        assert "schedule.global_rate" in lines.split("config reloaded (file changed)")[1].splitlines()[0]
        wait_for(
            lambda: (status(port) or {}).get("config") == {"path": str(path), "read": True}, 10, "status"
        )
        doc = status(port)
        assert doc is not None
        overall = doc["overall"]
        assert isinstance(overall, dict) and overall["configured_rate"] == 10.0, overall
    finally:
        stop_process(proc)
