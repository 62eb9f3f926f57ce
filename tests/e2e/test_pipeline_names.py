"""Pipelines are named by the proxy URL's user name (issue 11): the label is bounded and the access line
names it, the name never travels upstream, with [auth] users the user name is both credential and
pipeline, and the lines `politeproxy env --pipeline` prints name it for curl and duckdb. The fair shares
themselves are measured in test_pipelines.py."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.support.pipelines import D, Factory, config, metric_lines
from tests.support.processes import POLITEPROXY, ROOT, wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.upstream_proc import Upstream


def test_the_pipeline_label_is_bounded_and_the_access_line_names_it(
    proxy_factory: Factory, upstream: Upstream
) -> None:
    p = proxy_factory(upstream, config(0.0, extra="[pipelines.late]\nweight = 1\n"))
    s = requests.Session()
    for i in range(60):
        r = s.get(f"http://{D}/p/n{i}/x", proxies={"http": f"http://n{i}:@127.0.0.1:{p.port}"}, timeout=30)
        assert r.status_code == 200
    r = s.get(f"http://{D}/p/late/x", proxies={"http": f"http://late:@127.0.0.1:{p.port}"}, timeout=30)
    assert r.status_code == 200
    names: set[str] = set()
    for metric in (
        "politeproxy_requests_total",
        "politeproxy_grants_total",
        "politeproxy_wait_seconds_count",
    ):
        found = {
            m.group(1) for line in metric_lines(p, metric) if (m := re.search(r'pipeline="([^"]*)"', line))
        }
        assert "late" in found and "other" in found and "n0" in found and "n59" not in found, (metric, found)
        names |= found
    assert len(names) <= 50 + 3  # the first 50 names, the configured one, default, other
    wait_for(lambda: "pipeline=n3 " in p.log() or "pipeline=n3\n" in p.log(), 10, "access line")


def test_the_pipeline_name_is_never_forwarded_upstream(proxy_factory: Factory) -> None:
    """A raw upstream that records the request head it gets: no Proxy-Authorization reaches it."""
    heads: list[bytes] = []
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(10)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(10)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            heads.append(buf)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = srv.getsockname()[1]
    resolve = f'[upstream.resolve]\n"{D}:80" = "127.0.0.1:{port}"\n'
    p = proxy_factory(None, config(0.0) + resolve)
    r = requests.get(
        f"http://{D}/p/secret/x", proxies={"http": f"http://secret:pw@127.0.0.1:{p.port}"}, timeout=30
    )
    t.join(10)
    srv.close()
    assert r.status_code == 200 and len(heads) == 1
    assert b"proxy-authorization" not in heads[0].lower() and b"secret:pw" not in heads[0]
    assert any('pipeline="secret"' in line for line in metric_lines(p, "politeproxy_grants_total"))


def test_with_users_the_user_name_is_credential_and_pipeline(
    proxy_factory: Factory, upstream: Upstream
) -> None:
    p = proxy_factory(upstream, config(0.0, extra='[auth.users]\nurls = "s3cret"\n'))
    r = requests.get(
        f"http://{D}/p/urls/x", proxies={"http": f"http://urls:s3cret@127.0.0.1:{p.port}"}, timeout=30
    )
    assert r.status_code == 200
    bad = requests.get(
        f"http://{D}/p/urls/y", proxies={"http": f"http://urls:nope@127.0.0.1:{p.port}"}, timeout=30
    )
    assert bad.status_code == 407
    assert any('pipeline="urls"' in line for line in metric_lines(p, "politeproxy_grants_total"))


@pytest.fixture(scope="module")
def env_proxy(module_proxy_factory: Factory, module_upstream: Upstream) -> ProxyProc:
    """One proxy with no global gap for the two `env --pipeline` cases (each names its own pipeline)."""
    return module_proxy_factory(module_upstream, config(0.0))


def test_env_pipeline_names_the_pipeline(env_proxy: ProxyProc, tmp_path: Path) -> None:
    p = for_this_test(env_proxy)
    out = subprocess.run(
        [
            *POLITEPROXY,
            "env",
            "--data-dir",
            str(p.data_dir),
            "--listen",
            f"127.0.0.1:{p.port}",
            "--pipeline",
            "urls",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    assert f"export HTTPS_PROXY=http://urls:x@127.0.0.1:{p.port}" in out
    assert "SET http_proxy_username = 'urls'; SET http_proxy_password = 'x';" in out
    env = {**p.env}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            env[k] = v
    curl = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"https://{D}/p/urls/curl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert curl.stdout == "200", curl.stderr
    assert any('pipeline="urls"' in line for line in metric_lines(p, "politeproxy_grants_total"))
    bad = subprocess.run(
        [*POLITEPROXY, "env", "--data-dir", str(tmp_path / "d"), "--pipeline", "a b"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "--pipeline" in bad.stderr


DUCKDB = r"""
import duckdb, duckdb_ext, os, sys
platform = duckdb.sql("PRAGMA platform").fetchone()[0]
ext = os.path.join(list(duckdb_ext.__path__)[0], "extensions", f"v{duckdb.__version__}", platform,
                   "httpfs.duckdb_extension")
con = duckdb.connect()
con.execute(f"LOAD '{ext}'")
con.execute(f"SET http_proxy = '{sys.argv[1]}'")
con.execute(f"SET ca_cert_file = '{sys.argv[2]}'")
for line in sys.argv[3].split(";"):
    if line.strip():
        con.execute(line)
print(con.execute("SELECT content FROM read_text('https://data.commoncrawl.org/p/ducks/1')").fetchone()[0])
"""


def test_duckdb_names_its_pipeline_with_the_env_lines(env_proxy: ProxyProc) -> None:
    """The duckdb settings `env --pipeline` prints make duckdb's requests count as that pipeline."""
    pytest.importorskip("duckdb")
    pytest.importorskip("duckdb_ext")
    p = for_this_test(env_proxy)
    out = subprocess.run(
        [
            *POLITEPROXY,
            "env",
            "--data-dir",
            str(p.data_dir),
            "--listen",
            f"127.0.0.1:{p.port}",
            "--pipeline",
            "ducks",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    sql = next(line for line in out.splitlines() if "http_proxy_username" in line).removeprefix("# duckdb:")
    run = subprocess.run(
        [sys.executable, "-c", DUCKDB, f"127.0.0.1:{p.port}", p.env["SSL_CERT_FILE"], sql],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "hello from data.commoncrawl.org" in run.stdout, run.stderr[-2000:]
    assert any('pipeline="ducks"' in line for line in metric_lines(p, "politeproxy_grants_total"))
