"""The tools page's settings that make each client wait well through refusals (issue 41, docs/tools.md
"When the proxy says not now"): each recipe, run as written there, finishes every request through a proxy
that refuses part of a burst.

The proxy paces 4 requests/s and, with no client rules (``[clients] keep_defaults = false``), holds a request
at most 1 s: a burst of 8 at once gets about half of it refused, each refusal a 503 with Retry-After.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import duckdb_settings, run_py
from tests.support.processes import PY, ROOT
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import ProxyFactory, arrivals, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def refusing(
    module_proxy_factory: ProxyFactory, module_files_upstream: Upstream, certs: Certs
) -> Iterator[ProxyProc]:
    text = (
        NO_ROBOTS
        + '[schedule]\nbackend = "memory"\nglobal_rate = "4/s"\n'
        + '[pacing]\nmax_wait = "1s"\nretries = 0\n[cache]\nenabled = false\n'
        + "[clients]\nkeep_defaults = false\n"
        + upstream_toml(module_files_upstream, certs)
    )
    p = module_proxy_factory(None, text)
    yield p


def refusals(p: ProxyProc, host: str) -> float:
    """Requests to ``host`` the pacer refused so far (the access log sums repeats: /metrics counts each)."""
    return p.metric("politeproxy_rejected_total", f'host="{host}",reason="max_wait"')


def test_requests_with_urllib3_retry_waits_out_refusals(
    refusing: ProxyProc, module_files_upstream: Upstream
) -> None:
    module_files_upstream.reset()
    out = run_py(
        refusing,
        """
        import concurrent.futures, json, requests
        from requests.adapters import HTTPAdapter
        from urllib3.util import Retry

        # the recipe (docs/tools.md): retry 503 after the Retry-After the proxy sends
        retry = Retry(total=10, status_forcelist=[503], respect_retry_after_header=True, backoff_factor=0.5,
                      allowed_methods=["GET", "HEAD"])
        s = requests.Session()
        s.mount("https://", HTTPAdapter(max_retries=retry, pool_maxsize=8))
        def one(i):
            r = s.get(f"https://data.commoncrawl.org/echo?recipe=urllib3&i={i}", timeout=60)
            return r.status_code, len(r.raw.retries.history) if r.raw.retries else 0
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            print(json.dumps(list(pool.map(one, range(16)))))
        """,
    )
    answers = json.loads(out.strip().splitlines()[-1])
    assert all(status == 200 for status, _ in answers), answers
    assert sum(retried for _, retried in answers) >= 1, answers  # the burst was refused in part
    assert len([a for a in arrivals(module_files_upstream) if "recipe=urllib3" in a["path"]]) == 16


def test_duckdb_with_its_retry_settings_waits_out_refusals(
    refusing: ProxyProc, module_files_upstream: Upstream, module_files_dir: Path
) -> None:
    (module_files_dir / "recipe.csv").write_text("n\n" + "\n".join(str(i) for i in range(100)) + "\n")
    module_files_upstream.reset()
    before = refusals(refusing, "data.commoncrawl.org")
    proxy, bundle = duckdb_settings(refusing)
    code = textwrap.dedent(
        f"""
        import concurrent.futures, duckdb, duckdb_ext
        ext_dir = list(duckdb_ext.__path__)[0] + "/extensions"
        def one(i):
            con = duckdb.connect(config={{"autoinstall_known_extensions": False}})
            con.execute(f"SET extension_directory = '{{ext_dir}}'")
            con.execute("LOAD httpfs")
            con.execute("SET http_proxy = '{proxy}'; SET ca_cert_file = '{bundle}'")
            # the recipe (docs/tools.md): more tries, a longer wait between them
            con.execute("SET http_retries = 10; SET http_retry_wait_ms = 1000; SET http_retry_backoff = 1.5")
            return con.execute("SELECT sum(n) FROM read_csv('https://data.commoncrawl.org/files/recipe.csv')").fetchone()[0]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            print(list(pool.map(one, range(6))))
        """
    )
    r = subprocess.run(
        [PY, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT, env={"PATH": "/usr/bin:/bin"}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str([4950] * 6), r.stdout
    assert refusals(refusing, "data.commoncrawl.org") > before  # some of its requests were refused


def test_cdx_toolkit_waits_out_refusals_as_it_is(
    refusing: ProxyProc, module_files_upstream: Upstream, tmp_path: Path
) -> None:
    """cdx_toolkit retries every 503 itself, doubling its wait: nothing to set."""
    module_files_upstream.reset()
    before = refusals(refusing, "index.commoncrawl.org")
    out = run_py(
        refusing,
        """
        import concurrent.futures, json, cdx_toolkit
        def one(i):
            cdx = cdx_toolkit.CDXFetcher(source="cc", crawl=["CC-MAIN-2024-20"])
            return [c["url"] for c in cdx.iter(f"example{i}.com/*", limit=2)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            print(json.dumps(list(pool.map(one, range(6)))))
        """,
        {"CDXT_CACHE_DIR": str(tmp_path / "cdxt-cache") + "/"},
    )
    found = json.loads(out.strip().splitlines()[-1])
    assert all(len(urls) == 2 for urls in found), found
    assert refusals(refusing, "index.commoncrawl.org") > before
