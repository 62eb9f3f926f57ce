"""Real clients run with the environment ``politeproxy env`` prints: Python code in a fresh interpreter, and
duckdb's settings from the ``# duckdb:`` line of the same output."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import textwrap

from tests.support.processes import POLITEPROXY, PY, ROOT
from tests.support.proxy_proc import ProxyProc


def run_py(p: ProxyProc, code: str, extra_env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter with the `politeproxy env` environment; return its stdout."""
    r = subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        env={**p.env, **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"stdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def duckdb_settings(p: ProxyProc) -> tuple[str, str]:
    """http_proxy and ca_cert_file from the `# duckdb:` line of the real `politeproxy env` output."""
    out = subprocess.run(
        [*POLITEPROXY, "env", "--data-dir", str(p.data_dir), "--listen", f"127.0.0.1:{p.port}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("# duckdb:"))
    m = re.search(r"SET http_proxy = '([^']+)'; SET ca_cert_file = '([^']+)';", line)
    assert m, line
    return m.group(1), m.group(2)


def env_output(p: ProxyProc, *args: str) -> str:
    """What `politeproxy env` prints for this proxy, with ``args`` (``--pipeline NAME``): the CLI's own code,
    run in this process (no interpreter start)."""
    from politeproxy.commands import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["env", "--data-dir", str(p.data_dir), "--listen", f"127.0.0.1:{p.port}", *args])
    assert rc == 0, buf.getvalue()
    return buf.getvalue()


def exported(env_out: str) -> dict[str, str]:
    """The variables a shell's ``eval`` of ``env_out`` sets, read by bash itself (so quoting is as a shell
    reads it)."""
    script = 'eval "$ENV_OUT" && env -0'
    out = subprocess.run(
        ["bash", "-c", script],
        env={"ENV_OUT": env_out, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=True,
    ).stdout.decode()
    pairs = (item.partition("=") for item in out.split("\0") if item)
    names = {line.removeprefix("export ").partition("=")[0] for line in env_out.splitlines()}
    return {k: v for k, _, v in pairs if k in names}
