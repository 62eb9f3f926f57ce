"""``politeproxy doctor`` against a real proxy and the fake upstream (issue 13).

The good environment is the one ``eval "$(politeproxy env)"`` makes in a real bash; the broken ones change
one thing each: no proxy variable, a CA bundle without the proxy's CA, no_proxy covering Common Crawl,
the proxy down, one case of a variable missing.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from politeproxy.commands import doctor
from tests.support.processes import POLITEPROXY, ROOT, free_port
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.upstream_proc import Certs, Upstream, start_upstream

URL = "https://index.commoncrawl.org/collinfo.json"


@pytest.fixture(scope="module")
def up(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = start_upstream(certs, tmp_path_factory.mktemp("doctor-up"))
    yield u
    u.stop()


@pytest.fixture(scope="module")
def proxy(up: Upstream, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    fast_index = '[hosts."index.commoncrawl.org"]\ninterval = "0s"\n'  # one request per test, no 1 s gap
    p = start_proxy(tmp_path_factory.mktemp("doctor"), up, certs, NO_ROBOTS + fast_index)
    yield p
    p.stop()


def _env_lines(proxy: ProxyProc) -> str:
    cmd = [*POLITEPROXY, "env", "--data-dir", str(proxy.data_dir), "--listen", f"127.0.0.1:{proxy.port}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="module")
def env_out(proxy: ProxyProc) -> str:
    return _env_lines(proxy)


def _exported(env_out: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    for line in env_out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            env[k] = shlex.split(v)[0]
    return env


@pytest.fixture
def good(env_out: str) -> dict[str, str]:
    """The variables `politeproxy env` exports, read as a shell reads them (a fresh copy per test)."""
    return _exported(env_out)


def _run(env: dict[str, str], url: str = URL) -> tuple[int, str]:
    out = io.StringIO()
    return doctor.run(env, url, out), out.getvalue()


def test_good_environment_from_the_real_env_output(proxy: ProxyProc, up: Upstream) -> None:
    """In bash, after eval "$(politeproxy env)": every check passes and one request went upstream."""
    up.reset()
    clean = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    script = f'eval "$({shlex.join(POLITEPROXY)} env --data-dir {shlex.quote(str(proxy.data_dir))} '
    script += f'--listen 127.0.0.1:{proxy.port})" && {shlex.join(POLITEPROXY)} doctor'
    r = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=90
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout and "FAIL" not in r.stdout
    assert f"GET {URL} through the proxy: 200, Via: 1.1 politeproxy" in r.stdout
    assert "intercepted, paced (held " in r.stdout and "answered by the upstream: 200 OK" in r.stdout
    arrivals = [a for a in up.log() if a["path"] == "/collinfo.json"]
    assert [a["host"] for a in arrivals] == ["index.commoncrawl.org"]  # one request, through the proxy


def test_a_warm_cache_never_answers_doctor(good: dict[str, str], proxy: ProxyProc, up: Upstream) -> None:
    """Issue 45: doctor passed on an answer from the proxy's cache, so it never showed that Common Crawl can
    be reached. Its GET asks the proxy not to answer from the cache: one request reaches the upstream each
    time, and the line says it was paced and answered there."""
    handler = urllib.request.ProxyHandler({"https": f"http://127.0.0.1:{proxy.port}"})
    ctx = ssl.create_default_context(cafile=good["REQUESTS_CA_BUNDLE"])
    opener = urllib.request.build_opener(handler, urllib.request.HTTPSHandler(context=ctx))
    up.reset()
    for _ in range(2):  # the first fills the cache, the second is answered from it
        with opener.open(URL, timeout=30) as r:
            assert r.status == 200
    # The cache is warm: the second at least came from it (the first too, after an earlier test's fetch).
    assert len([a for a in up.log() if a["path"] == "/collinfo.json"]) <= 1
    up.reset()
    for _ in range(2):
        code, out = _run(good)
        assert code == 0, out
        assert "intercepted, paced (held " in out and "answered by the upstream: 200 OK" in out, out
    assert len([a for a in up.log() if a["path"] == "/collinfo.json"]) == 2  # each doctor run, upstream


def test_no_proxy_variable(good: dict[str, str]) -> None:
    env = good
    del env["HTTPS_PROXY"], env["https_proxy"]
    code, out = _run(env)
    assert code == 1
    assert "FAIL  neither HTTPS_PROXY nor https_proxy is set" in out
    assert f"fix: {doctor.FIX_ENV}" in out


def test_one_case_missing(good: dict[str, str]) -> None:
    env = good
    del env["https_proxy"], env["no_proxy"]
    code, out = _run(env)
    assert code == 1
    assert "FAIL  https_proxy is not set" in out and "FAIL  no_proxy is not set" in out
    assert "Via: 1.1 politeproxy" in out  # the request still went through (HTTPS_PROXY)


def test_wrong_ca_bundle(good: dict[str, str], tmp_path: Path) -> None:
    env = good
    for var in doctor.BUNDLE_VARS:
        env[var] = certifi.where()  # the public roots only: the proxy's leaves do not verify
    env["CURL_CA_BUNDLE"] = str(tmp_path / "gone.pem")
    code, out = _run(env)
    assert code == 1
    assert f"FAIL  SSL_CERT_FILE={certifi.where()} does not hold this proxy's CA" in out
    assert f"FAIL  CURL_CA_BUNDLE={tmp_path / 'gone.pem'} does not exist" in out
    assert f"FAIL  GET {URL} through the proxy failed" in out and "CERTIFICATE_VERIFY_FAILED" in out


def test_no_proxy_covering_common_crawl(good: dict[str, str]) -> None:
    env = good
    env["no_proxy"] = env["no_proxy"] + ",.commoncrawl.org"
    env["NO_PROXY"] = env["NO_PROXY"] + ",*.amazonaws.com:443"
    code, out = _run(env)
    assert code == 1
    assert "FAIL  no_proxy sends commoncrawl.org, data.commoncrawl.org, index.commoncrawl.org around" in out
    assert "FAIL  NO_PROXY sends commoncrawl.s3.amazonaws.com around the proxy" in out


def test_proxy_down(good: dict[str, str]) -> None:
    env = good
    dead = f"http://127.0.0.1:{free_port()}"
    for var in ("HTTPS_PROXY", "https_proxy"):
        env[var] = dead
    code, out = _run(env)
    assert code == 1
    assert f"FAIL  no proxy answers at 127.0.0.1:{dead.rsplit(':', 1)[1]}" in out
    assert f"fix: start it: {doctor.COMMAND} run" in out
    assert "GET " not in out  # nothing to send through


def test_bad_url_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(argparse.Namespace(url="http://index.commoncrawl.org/")) == 2
    assert "an https:// URL" in capsys.readouterr().err


def test_a_proxy_url_politeproxy_does_not_speak(good: dict[str, str]) -> None:
    env = good
    for var in ("HTTPS_PROXY", "https_proxy"):
        env[var] = "socks5://127.0.0.1:1080"
    code, out = _run(env)
    assert code == 1
    assert "FAIL  the proxy URL 'socks5://127.0.0.1:1080' is not http://HOST:PORT" in out


def test_a_502_from_the_proxy_is_a_failure(certs: Certs, tmp_path: Path) -> None:
    """Issue 25 item 10: a proxy whose upstream does not answer makes a 502 (with its Via): doctor fails
    that check, and says what the proxy answered."""
    dead = free_port()
    resolve = f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n'
    resolve += f'"index.commoncrawl.org:443" = "127.0.0.1:{dead}"\n'
    fast_index = '[hosts."index.commoncrawl.org"]\ninterval = "0s"\n'
    p = start_proxy(tmp_path, None, None, resolve + NO_ROBOTS + fast_index)
    try:
        code, out = _run(_exported(_env_lines(p)))
    finally:
        p.stop()
    assert code == 1, out
    assert f"FAIL  GET {URL} through the proxy: 502" in out, out
    assert "1 of " in out and "checks failed" in out  # every other check passed


def test_an_upstream_error_status_is_a_failure(good: dict[str, str]) -> None:
    """An answer the upstream made (404 here), passed on with the proxy's Via, is not "ok" either."""
    url = "https://index.commoncrawl.org/status/404"
    code, out = _run(good, url)
    assert code == 1, out
    assert f"FAIL  GET {url} through the proxy: 404" in out, out


def test_fix_lines_name_a_command_this_shell_can_run(proxy: ProxyProc) -> None:
    """Issue 26 item 6: with the venv's bin off PATH (as after `make run`), the fix lines name the
    installed script by its absolute path; with it on PATH, bare `politeproxy`."""
    script = Path(sys.prefix) / "bin" / "politeproxy"
    if not script.is_file():
        pytest.skip("no installed politeproxy script in this environment")
    dead = f"http://127.0.0.1:{free_port()}"
    code = "from politeproxy.commands import doctor; print(doctor.FIX_ENV); print(doctor.COMMAND)"
    base = {k: v for k, v in os.environ.items() if k != "PATH"}
    paths = {"off": "/usr/bin:/bin", "on": f"{script.parent}:/usr/bin:/bin"}
    got = {}
    for name, path in paths.items():
        env = {**base, "PATH": path, "HTTPS_PROXY": dead, "https_proxy": dead}
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        got[name] = r.stdout.splitlines()
    assert got["off"] == [f'eval "$({script} env)"', str(script)]
    assert got["on"] == ['eval "$(politeproxy env)"', "politeproxy"]
    r = subprocess.run(
        ["bash", "-c", f"{got['off'][1]} --version"],
        env={**base, "PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.startswith("politeproxy"), r.stderr
