"""The recipes of docs/tools.md (issue 45 item 2), each run as written against the fake upstream, with the
environment `politeproxy env` gives: httpx, polars (https:// and s3://), aria2c, rclone (HTTP and S3, with
the env line that breaks its S3 backend emptied), Node through undici's EnvHttpProxyAgent. Each must reach
the upstream through the proxy (the proxy's access line, the upstream's arrival log)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.proxy_proc import FAST, ProxyProc, start_proxy
from tests.support.proxyio import arrivals
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEXT = b"a recipe that works\n"
ROWS = 100
NODE_MODULES = Path(sys.prefix) / "node" / "node_modules"  # the Makefile's undici for the Node recipe


@pytest.fixture(scope="module")
def served(certs: Certs) -> Iterator[tuple[ProxyProc, Upstream, Path]]:
    tmp = Path(tempfile.mkdtemp(prefix="pp-recipes-"))
    files = tmp / "files"
    files.mkdir()
    (files / "r.txt").write_bytes(TEXT)
    for name in ("a", "b", "c"):  # one object per recipe: the proxy's cache would answer a second read
        pq.write_table(pa.table({"n": list(range(ROWS))}), files / f"{name}.parquet")
    up = start_upstream(certs, tmp, files_dir=files)
    p = start_proxy(tmp, up, certs, FAST)
    yield p, up, tmp
    p.stop()
    up.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def sh(p: ProxyProc, script: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``script`` in sh, in a shell that ran ``eval "$(politeproxy env)"`` (the proxy's env lines)."""
    env = {**p.env, "HOME": str(cwd), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def py(p: ProxyProc, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Python ``code`` from a file, run as the shell would run it after the env lines."""
    (cwd / "recipe.py").write_text(code)
    return sh(p, "python recipe.py", cwd)


def hosts_of(up: Upstream, marker: str) -> list[str]:
    return [a["host"] for a in arrivals(up) if marker in a["path"]]


def test_httpx(served: tuple[ProxyProc, Upstream, Path]) -> None:
    p, up, tmp = served
    url = "https://data.commoncrawl.org/files/r.txt?httpx"
    code = f"import httpx; r = httpx.get('{url}'); print(r.headers['via']); print(r.text.strip())"
    r = py(p, code, tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1.1 politeproxy", TEXT.decode().strip()]
    assert hosts_of(up, "?httpx") == ["data.commoncrawl.org"]


@pytest.mark.parametrize(
    "source, options, host",
    [
        ("https://data.commoncrawl.org/cc-index/table/a.parquet", "{}", "data.commoncrawl.org"),
        (
            "s3://commoncrawl/cc-index/table/b.parquet",
            '{"skip_signature": "true", "aws_region": "us-east-1", "virtual_hosted_style_request": "true"}',
            "commoncrawl.s3.us-east-1.amazonaws.com",
        ),
    ],
    ids=["https", "s3"],
)
def test_polars(served: tuple[ProxyProc, Upstream, Path], source: str, options: str, host: str) -> None:
    pytest.importorskip("polars")
    p, up, tmp = served
    code = f"import polars as pl; print(pl.read_parquet({source!r}, storage_options={options}).height)"
    r = py(p, code, tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(ROWS)]
    seen = {a["host"] for a in arrivals(up, "/cc-index/table/" + source.rsplit("/", 1)[1])}
    assert seen == {host}


def test_aria2c(served: tuple[ProxyProc, Upstream, Path]) -> None:
    if shutil.which("aria2c") is None:
        pytest.skip("aria2c is not installed (Debian: aria2)")
    p, up, tmp = served
    url = "https://data.commoncrawl.org/files/r.txt?aria2c"
    r = sh(p, f'aria2c -q --allow-overwrite=true --ca-certificate="$SSL_CERT_FILE" -o aria.txt "{url}"', tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp / "aria.txt").read_bytes() == TEXT
    assert hosts_of(up, "?aria2c") == ["data.commoncrawl.org"]
    # Without --ca-certificate: Debian's aria2c (GnuTLS) reads no SSL_CERT_FILE and refuses the proxy's
    # leaf, loudly (exit 1): a failure, not a bypass.
    r = sh(p, f'aria2c -q --allow-overwrite=true -o aria2.txt "{url}&nocert"', tmp)
    assert r.returncode != 0 and not hosts_of(up, "&nocert")


def test_rclone_http(served: tuple[ProxyProc, Upstream, Path]) -> None:
    if shutil.which("rclone") is None:
        pytest.skip("rclone is not installed")
    p, up, tmp = served
    r = sh(p, "rclone copyurl 'https://data.commoncrawl.org/files/r.txt?rclone' rclone.txt", tmp)
    assert r.returncode == 0, r.stderr
    assert (tmp / "rclone.txt").read_bytes() == TEXT
    assert hosts_of(up, "?rclone") == ["data.commoncrawl.org"]


def test_rclone_s3_with_aws_ca_bundle_emptied(served: tuple[ProxyProc, Upstream, Path]) -> None:
    """rclone's S3 backend (AWS SDK for Go v1) fails on AWS_CA_BUNDLE from the env lines; emptied for the one
    command, it reads SSL_CERT_FILE like any Go program and goes through the proxy."""
    if shutil.which("rclone") is None:
        pytest.skip("rclone is not installed")
    p, up, tmp = served
    remote = ":s3,provider=AWS,region=us-east-1:commoncrawl/cc-index/table/c.parquet"
    broken = sh(p, f"rclone copyto '{remote}' broken.parquet", tmp)
    assert broken.returncode != 0 and "LoadCustomCABundleError" in broken.stderr, broken.stderr
    r = sh(p, f"AWS_CA_BUNDLE= rclone copyto '{remote}' s3.parquet", tmp)
    assert r.returncode == 0, r.stderr
    assert pq.read_table(tmp / "s3.parquet").num_rows == ROWS
    seen = {a["host"] for a in arrivals(up, "/cc-index/table/c.parquet")}
    assert seen == {"commoncrawl.s3.us-east-1.amazonaws.com"}


NODE = """
const { setGlobalDispatcher, EnvHttpProxyAgent } = require("undici");
setGlobalDispatcher(new EnvHttpProxyAgent());
fetch("https://data.commoncrawl.org/files/r.txt?node").then(async (r) => {
  console.log(r.headers.get("via"));
  console.log((await r.text()).trim());
});
"""


def test_node_undici_env_http_proxy_agent(served: tuple[ProxyProc, Upstream, Path]) -> None:
    if shutil.which("node") is None or not (NODE_MODULES / "undici").is_dir():
        pytest.skip(f"node, or undici in {NODE_MODULES} (the Makefile's step), is missing")
    p, up, tmp = served
    (tmp / "recipe.js").write_text(textwrap.dedent(NODE))
    r = sh(p, f"NODE_PATH='{NODE_MODULES}' node recipe.js", tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1.1 politeproxy", TEXT.decode().strip()]
    assert hosts_of(up, "?node") == ["data.commoncrawl.org"]
