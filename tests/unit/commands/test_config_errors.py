"""Every kind of config mistake, through the command line's own entry point in this process: ``run`` and
``check-config`` exit 2 with the same one line naming the file, the key and what is wrong, and
``POLITEPROXY_CONFIG`` is read the same way. tests/e2e/test_config_cli.py runs three of these cases as
real processes (an unknown key, a bad duration, not TOML): the exit status and stderr of the interpreter;
here every case costs no interpreter start (three each, ~45 in all, until 2026-12-07).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from politeproxy.commands import cli
from tests.support.processes import free_port

BAD = [
    ("[upstream]\nbogus = 1\n", "upstream.bogus", "unknown key"),
    ("listnen = '127.0.0.1:1'\n", "listnen", "unknown key"),
    ("[client]\nidle_timeout = true\n", "client.idle_timeout", "duration"),
    ("[upstream]\nconnect_timeout = 'soon'\n", "upstream.connect_timeout", "duration"),
    ("listen = 3128\n", "listen", "string"),
    ("listen = 'localhost'\n", "listen", "HOST:PORT"),
    ("allow_clients = '10.0.0.0/8'\n", "allow_clients", "list"),
    ("allow_clients = ['10.0.0.0/33']\n", "allow_clients[0]", "CIDR"),
    ("paced_hosts = ['*']\n", "paced_hosts[0]", "two labels"),
    ("[schedule]\nbackend = 'postgres'\n", "schedule.backend", "one of"),
    ("[client]\nmax_header_size = 'big'\n", "client.max_header_size", "integer"),
    ("[upstream.resolve]\n'data.commoncrawl.org:443' = 'nowhere'\n", "upstream.resolve", "HOST:PORT"),
    ("[auth]\nusers = ['alice']\n", "auth.users", "table"),
    ("upstream = 1\n", "upstream", "table"),
    ("this is = not toml [\n", "not valid TOML", ""),
]


def run_cli(*args: str) -> tuple[int, str]:
    """``politeproxy ARGS`` in this process: its exit status (returned or raised) and its stderr."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = cli.main(list(args))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No POLITEPROXY_* from the outside, a private XDG_DATA_HOME (the default data dir)."""
    for k in [k for k in os.environ if k.startswith("POLITEPROXY_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.mark.parametrize(("text", "key", "what"), BAD)
def test_invalid_config_refuses_to_start(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, key: str, what: str
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    rc, err = run_cli("run", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}")
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert key in lines[0] and what in lines[0], lines[0]
    assert str(cfg) in lines[0]
    # check-config says the same, with the same exit code.
    rc, err = run_cli("check-config", str(cfg))
    assert rc == 2 and err.strip() == lines[0]
    # And POLITEPROXY_CONFIG is read the same way.
    monkeypatch.setenv("POLITEPROXY_CONFIG", str(cfg))
    rc, err = run_cli("run", "--listen", f"127.0.0.1:{free_port()}")
    assert rc == 2 and err.strip() == lines[0]
