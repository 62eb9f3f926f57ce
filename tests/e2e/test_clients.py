"""Real clients through the proxy, configured only by what `politeproxy env` prints.

Each client runs in its own process with the environment from the real `politeproxy env` output
(``ProxyProc.env``); duckdb takes its settings from the `# duckdb:` comment line of the same output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.clients import duckdb_settings, run_py
from tests.support.processes import need_tool
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import ProxyFactory, arrivals, start_with
from tests.support.upstream_proc import Certs, Upstream

# One files upstream and one proxy for the module: every client here only sends requests, each test
# writes files of its own names, and the arrival log is reset before each test.


@pytest.fixture
def files_dir(module_files_dir: Path) -> Path:
    return module_files_dir


@pytest.fixture
def files_upstream(module_files_upstream: Upstream) -> Upstream:
    module_files_upstream.reset()
    return module_files_upstream


@pytest.fixture(scope="module")
def module_cp(module_proxy_factory: ProxyFactory, module_files_upstream: Upstream, certs: Certs) -> ProxyProc:
    return start_with(module_proxy_factory, module_files_upstream, certs)


@pytest.fixture
def cp(module_cp: ProxyProc, files_upstream: Upstream) -> ProxyProc:
    return for_this_test(module_cp)


def curl(p: ProxyProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("curl"), "-sS", "--max-time", "60", *args], env=p.env, capture_output=True, text=True
    )


def test_env_lines_are_what_clients_get(cp: ProxyProc) -> None:
    for key in ("HTTPS_PROXY", "HTTP_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        assert key in cp.env
    assert cp.env["HTTPS_PROXY"] == cp.url
    assert cp.env["SSL_CERT_FILE"] == str(cp.data_dir / "trust-bundle.pem")  # system + certifi + CA


def test_curl(cp: ProxyProc, files_upstream: Upstream, files_dir: Path, certs: Certs, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (files_dir / "c.bin").write_bytes(data)
    r = curl(cp, "https://data.commoncrawl.org/echo?curl=1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == "/echo?curl=1"
    # HEAD
    r = curl(cp, "-I", "https://data.commoncrawl.org/size/4321")
    assert r.returncode == 0, r.stderr
    assert re.search(r"(?im)^content-length: 4321\r?$", r.stdout), r.stdout
    # Range
    out = tmp_path / "range.bin"
    r = curl(
        cp, "-r", "10-109", "-o", str(out), "-w", "%{http_code}", "https://data.commoncrawl.org/files/c.bin"
    )
    assert r.stdout == "206" and out.read_bytes() == data[10:110]
    # POST a file
    body = tmp_path / "body.bin"
    body.write_bytes(data)
    r = curl(cp, "--data-binary", f"@{body}", "https://commoncrawl.org/echo")  # data.* refuses a POST
    assert json.loads(r.stdout)["sha256"] == hashlib.sha256(data).hexdigest()
    # gzip, decoded by curl itself
    r = curl(cp, "--compressed", "https://data.commoncrawl.org/gzip")
    assert r.stdout == "hello gzip " * 100
    # plain http:// via HTTP_PROXY
    r = curl(cp, "http://data.commoncrawl.org/echo?plain=1")
    assert json.loads(r.stdout)["path"] == "/echo?plain=1"
    # A blind tunnel: curl sees other.example's own certificate.
    r = curl(cp, "--cacert", str(certs.ca_file), "https://other.example/hello")
    assert r.returncode == 0 and "hello from other.example" in r.stdout, r.stderr
    r = curl(cp, "https://other.example/hello")
    assert r.returncode == 60, r.stderr  # CURLE_PEER_FAILED_VERIFICATION: our bundle does not vouch for it
    hosts = [a["host"] for a in arrivals(files_upstream)]
    assert hosts.count("other.example") == 1


def test_requests(cp: ProxyProc, files_upstream: Upstream, files_dir: Path) -> None:
    (files_dir / "r.bin").write_bytes(b"0123456789" * 1000)
    out = run_py(
        cp,
        """
        import hashlib, json, requests
        with requests.Session() as s:
            r = s.get("https://data.commoncrawl.org/echo?requests=1", timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["path"] == "/echo?requests=1"
            r = s.get("https://data.commoncrawl.org/files/r.bin", headers={"Range": "bytes=5-14"}, timeout=30)
            assert r.status_code == 206 and r.content == b"5678901234", (r.status_code, r.content)
            r = s.head("https://data.commoncrawl.org/size/77", timeout=30)
            assert r.headers["Content-Length"] == "77" and r.content == b""
            r = s.get("https://data.commoncrawl.org/gzip", timeout=30)
            assert r.text == "hello gzip " * 100 and r.headers["Content-Encoding"] == "gzip"
            body = b"q" * 1_000_000
            r = s.post("https://commoncrawl.org/echo", data=body, timeout=30)  # data.* refuses a POST
            assert r.json()["sha256"] == hashlib.sha256(body).hexdigest()
            r = s.get("http://data.commoncrawl.org/echo?plain=1", timeout=30)
            assert r.json()["path"] == "/echo?plain=1"
        print("ok")
        """,
    )
    assert out.strip() == "ok"
    assert len(arrivals(files_upstream)) == 6


def test_aiohttp_trust_env(cp: ProxyProc, files_upstream: Upstream) -> None:
    out = run_py(
        cp,
        """
        import asyncio, aiohttp

        async def main():
            async with aiohttp.ClientSession(trust_env=True) as s:
                for i in range(5):
                    async with s.get(f"https://data.commoncrawl.org/echo?aiohttp={i}") as r:
                        assert r.status == 200, await r.text()
                        assert (await r.json())["path"] == f"/echo?aiohttp={i}"
                async with s.get("https://data.commoncrawl.org/size/100000?chunked=1") as r:
                    assert len(await r.read()) == 100000
                async with s.get("http://data.commoncrawl.org/echo?plain=1") as r:
                    assert (await r.json())["path"] == "/echo?plain=1"
            print("ok")

        asyncio.run(main())
        """,
    )
    assert out.strip() == "ok"
    assert len(arrivals(files_upstream)) == 7


def test_duckdb_httpfs(cp: ProxyProc, files_upstream: Upstream, files_dir: Path) -> None:
    pa = pytest.importorskip("pyarrow")  # optional: only this test writes parquet
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"url": [f"https://example.com/{i}" for i in range(1000)], "n": list(range(1000))})
    pq.write_table(table, files_dir / "x.parquet", row_group_size=100)
    (files_dir / "x.csv").write_text("a,b\n1,2\n3,4\n")
    http_proxy, ca_cert_file = duckdb_settings(cp)
    assert http_proxy == f"127.0.0.1:{cp.port}"
    out = run_py(
        cp,
        f"""
        import duckdb, duckdb_ext
        ext_dir = list(duckdb_ext.__path__)[0] + "/extensions"
        con = duckdb.connect(config={{"autoinstall_known_extensions": False}})
        con.execute(f"SET extension_directory = '{{ext_dir}}'")
        con.execute("LOAD httpfs")
        con.execute("SET http_proxy = '{http_proxy}'")
        con.execute("SET ca_cert_file = '{ca_cert_file}'")
        n, s = con.execute(
            "SELECT count(*), sum(n) FROM read_parquet('https://data.commoncrawl.org/cc-index/table/x.parquet')"
        ).fetchone()
        assert (n, s) == (1000, 499500), (n, s)
        got = con.execute(
            "SELECT url FROM read_parquet('https://data.commoncrawl.org/files/x.parquet') WHERE n = 42"
        ).fetchall()
        assert got == [("https://example.com/42",)], got
        rows = con.execute("SELECT * FROM read_csv('https://data.commoncrawl.org/files/x.csv')").fetchall()
        assert rows == [(1, 2), (3, 4)], rows
        print("ok")
        """,
    )
    assert out.strip() == "ok"
    seen = arrivals(files_upstream)
    assert any(a["path"] == "/cc-index/table/x.parquet" and a["range"] for a in seen), seen
    assert any(a["path"] == "/files/x.csv" for a in seen), seen
    assert all(a["host"] == "data.commoncrawl.org" for a in seen)


def test_cdx_toolkit(cp: ProxyProc, files_upstream: Upstream, tmp_path: Path) -> None:
    out = run_py(
        cp,
        """
        import json, cdx_toolkit
        cdx = cdx_toolkit.CDXFetcher(source="cc", crawl=["CC-MAIN-2024-20"])
        caps = list(cdx.iter("example.com/*", limit=2))
        print(json.dumps([dict(c) for c in caps]))
        """,
        {"CDXT_CACHE_DIR": str(tmp_path / "cdxt-cache") + "/"},
    )
    caps = json.loads(out.strip().splitlines()[-1])
    assert [c["url"] for c in caps] == ["https://example.com/page0", "https://example.com/page1"]
    assert caps[0]["filename"].startswith("crawl-data/CC-MAIN-2024-20/"), (caps, arrivals(files_upstream))
    seen = [(a["host"], a["path"].split("?")[0]) for a in arrivals(files_upstream)]
    assert seen[0] == ("index.commoncrawl.org", "/collinfo.json")
    assert ("index.commoncrawl.org", "/CC-MAIN-2024-20-index") in seen
    assert all(h == "index.commoncrawl.org" for h, _ in seen)
