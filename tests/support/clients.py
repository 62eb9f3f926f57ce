"""Real clients run with the environment ``politeproxy env`` prints: Python code in a fresh interpreter, and
duckdb's settings from the ``# duckdb:`` line of the same output."""

from __future__ import annotations

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
