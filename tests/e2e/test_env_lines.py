"""`politeproxy env` that works everywhere (issue 13 item 6), read by a real bash: quoted values, both
cases of no_proxy with the metadata addresses, a trust bundle that keeps the system's roots, and the
run flags that `make run ARGS=...` passes to it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import certifi
import pytest
import requests

from politeproxy.commands.envlines import system_roots
from tests.support.processes import POLITEPROXY, ROOT, free_port, need_tool, wait_for

VARS = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)


def eval_env(data_dir: Path, *args: str) -> dict[str, str]:
    """``eval "$(politeproxy env ...)"`` in a real bash, then each variable as bash sees it."""
    bash = need_tool("bash")
    cmd = " ".join(f'"${{A{i}}}"' for i in range(len(args)))
    script = 'eval "$("${PP[@]}" env --data-dir "$D" ' + cmd + ')" || exit 9\n'
    script += "".join(f'printf "%s\\0" "${{{v}-<unset>}}"\n' for v in VARS)
    pp = " ".join(f"'{p}'" for p in POLITEPROXY)
    env = {**os.environ, "D": str(data_dir), **{f"A{i}": a for i, a in enumerate(args)}}
    for v in VARS:
        env.pop(v, None)
    r = subprocess.run(
        [bash, "-c", f"PP=({pp})\n{script}"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return dict(zip(VARS, r.stdout.split("\0")[:-1], strict=True))


@pytest.fixture(scope="module")
def spaced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A data dir with a space, quotes, a $ and a backquote in its name, and what bash made of `env`
    for it. ($1 is not a variable name, so the path keeps it literally; $NAME would be expanded.)"""
    d = tmp_path_factory.mktemp("env") / "my data 'dir' $1 `x`"
    return d, eval_env(d, "--listen", "127.0.0.1:4567", "--pipeline", "team-a")


def test_values_survive_eval_with_a_space_in_the_data_dir(spaced: tuple[Path, dict[str, str]]) -> None:
    """Every path comes back whole (a space, quotes, $1 and a backquote in it), and the files exist."""
    d, got = spaced
    for v in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE"):
        assert got[v] == str(d / "trust-bundle.pem")
    assert got["NODE_EXTRA_CA_CERTS"] == str(d / "ca.pem")
    assert Path(got["SSL_CERT_FILE"]).is_file() and Path(got["NODE_EXTRA_CA_CERTS"]).is_file()
    for v in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert got[v] == "http://team-a:x@127.0.0.1:4567"


def test_no_proxy_in_both_cases_with_the_metadata_address(spaced: tuple[Path, dict[str, str]]) -> None:
    """wget reads only no_proxy, others only NO_PROXY; both keep loopback and the cloud metadata
    endpoint (169.254.169.254) away from the proxy."""
    _, got = spaced
    assert got["no_proxy"] == got["NO_PROXY"]
    entries = got["no_proxy"].split(",")
    for must in ("localhost", "127.0.0.1", "::1", "169.254.169.254"):
        assert must in entries


def test_the_bundle_keeps_the_system_roots_certifi_and_the_ca(spaced: tuple[Path, dict[str, str]]) -> None:
    """SSL_CERT_FILE replaces a tool's trust store, so the bundle holds the system's roots (corporate
    chains), certifi's roots and the proxy's CA, each whole."""
    d, got = spaced
    bundle = Path(got["SSL_CERT_FILE"]).read_text()
    ca = (d / "ca.pem").read_text().strip()
    assert ca in bundle
    certifi_pem = Path(certifi.where()).read_text()
    first_certifi = certifi_pem[certifi_pem.index("-----BEGIN") :].split("-----END CERTIFICATE-----")[0]
    assert first_certifi in bundle
    system = system_roots(d)
    if system is None:
        pytest.skip("no system root bundle on this machine")
    sys_pem = system.read_text()
    first_system = sys_pem[sys_pem.index("-----BEGIN") :].split("-----END CERTIFICATE-----")[0]
    assert first_system in bundle
    assert bundle.count("-----BEGIN CERTIFICATE-----") >= sys_pem.count("-----BEGIN CERTIFICATE-----") + 1


def test_env_takes_run_flags_and_checks_them(tmp_path: Path) -> None:
    """One ARGS serves `env` and `run` (make run): env accepts run's flags; a bad value fails the same."""
    base = [*POLITEPROXY, "env", "--data-dir", str(tmp_path / "d")]
    ok = subprocess.run(
        [*base, "--global-rate", "500ms", "-v", "--metrics-listen", "127.0.0.1:9", "--log-format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and "export HTTPS_PROXY=" in ok.stdout, ok.stderr
    system = system_roots(tmp_path / "d")
    # A comment says what the bundle holds, so a missing corporate chain can be traced.
    want = f"the system's roots ({system})" if system else "no system roots found"
    assert f"# trust-bundle.pem: {want}, certifi's roots and the proxy's CA" in ok.stdout, ok.stdout
    bad = subprocess.run([*base, "--global-rate", "5"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "write 5/s for a rate or 5s for a gap" in bad.stderr


@pytest.mark.slow  # make, env and a proxy start: about 3 s
def test_make_run_with_args(tmp_path: Path) -> None:
    """`make run ARGS="--global-rate 500ms -v"` (docs/getting-started.md) prints the env lines and runs the
    proxy at that rate (the install step is taken as done: -o skips it)."""
    make = shutil.which("make")
    if make is None or not (ROOT / ".venv" / "bin" / "politeproxy").exists():
        pytest.skip("make or the .venv that `make run` uses is missing")
    port = free_port()
    args = f"--global-rate 500ms -v --listen 127.0.0.1:{port} --data-dir {tmp_path / 'd'}"
    log = tmp_path / "make.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [make, "-s", "-o", ".venv/.installed-run", "run", f"ARGS={args}"],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def healthy() -> bool:
            try:
                return (
                    proc.poll() is not None or requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok
                )
            except requests.RequestException:
                return False

        wait_for(healthy, 30, "make run")
        text = log.read_text()
        assert proc.poll() is None, text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    assert f"export HTTPS_PROXY=http://127.0.0.1:{port}" in text
    assert "one grant per 500ms (2/s)" in text, text


def test_a_newline_in_the_data_dir_runs_nothing_under_eval(tmp_path: Path) -> None:
    """Issue 25 item 9: a data dir whose name holds newlines, a carriage return and a command
    substitution; `eval "$(politeproxy env)"` in bash runs none of the commands in it, and the values
    still name the files. (The comment lines named the path raw: the line after its newline ran.)"""
    bash = need_tool("bash")
    work = tmp_path / "cwd"
    work.mkdir()
    d = tmp_path / "dd\ntouch pwned1\n$(touch pwned2)\r\ntouch pwned3 #`touch pwned4`"
    pp = " ".join(f"'{p}'" for p in POLITEPROXY)
    script = f'PP=({pp})\ncd "$W"\nout="$(cd "$R" && "${{PP[@]}}" env --data-dir "$D")" || exit 9\n'
    script += 'eval "$out"\nprintf "%s" "$SSL_CERT_FILE"'
    env = {**os.environ, "D": str(d), "W": str(work), "R": str(ROOT)}
    for v in VARS:
        env.pop(v, None)
    r = subprocess.run([bash, "-c", script], env=env, capture_output=True, timeout=60)  # bytes: keep the \r
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in work.iterdir()) == [], "a command in the data dir's name ran"
    assert r.stdout.decode() == str(d / "trust-bundle.pem")
    assert Path(r.stdout.decode()).is_file()
