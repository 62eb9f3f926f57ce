"""Real clients and the shared cache (issue 14), counted from the fake upstream's arrival log.

A duckdb (httpfs) scan of a parquet file under /cc-index/table/, run twice in two fresh duckdb processes:
the second sends no request upstream and returns the same rows. cdx_toolkit run twice (each with an empty
cdx_toolkit cache of its own): collinfo.json goes upstream once, and so does each CDX question (the crawl is
published: issue 43 keeps its answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cache_upstream import CACHE_TOML
from tests.support.clients import duckdb_settings, run_py
from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pytestmark = pytest.mark.slow  # real client processes (duckdb, cdx_toolkit): about 7 s for the module
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TABLE = "https://data.commoncrawl.org/cc-index/table/cc-main/warc/crawl=CC-MAIN-2024-10/part-0.parquet"
DUCKDB = """
import duckdb, duckdb_ext, json
ext_dir = list(duckdb_ext.__path__)[0] + "/extensions"
con = duckdb.connect(config={{"autoinstall_known_extensions": False}})
con.execute(f"SET extension_directory = '{{ext_dir}}'")
con.execute("LOAD httpfs")
con.execute("SET http_proxy = '{proxy}'")
con.execute("SET ca_cert_file = '{ca}'")
q = "SELECT count(*), sum(n), min(url) FROM read_parquet('{table}') WHERE n % 7 = 3"
print(json.dumps(con.execute(q).fetchall()))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[tuple[Upstream, ProxyProc]]:
    tmp = tmp_path_factory.mktemp("cache-clients")
    files = tmp / "files"
    files.mkdir()
    t = pa.table({"url": [f"https://example.com/{i}" for i in range(50_000)], "n": list(range(50_000))})
    pq.write_table(t, files / "part-0.parquet", row_group_size=5000)  # ten row groups: many range reads
    up = start_upstream(certs, tmp, files_dir=files)
    p = start_proxy(tmp, None, None, CACHE_TOML + upstream_toml(up, certs))
    yield up, p
    p.stop()
    up.stop()


def table_arrivals(up: Upstream) -> list[dict[str, object]]:
    return [a for a in up.log() if str(a["path"]).startswith("/cc-index/table/")]


def test_a_second_duckdb_scan_sends_nothing_upstream(setup: tuple[Upstream, ProxyProc]) -> None:
    up, p = setup
    proxy, ca = duckdb_settings(p)
    code = DUCKDB.format(proxy=proxy, ca=ca, table=TABLE)
    first = json.loads(run_py(p, code).strip().splitlines()[-1])
    n1 = len(table_arrivals(up))
    assert n1 >= 2, table_arrivals(up)  # the footer and the row groups went upstream once
    second = json.loads(run_py(p, code).strip().splitlines()[-1])
    assert second == first and first[0][0] == 7143
    assert len(table_arrivals(up)) == n1, table_arrivals(up)[n1:]  # no request upstream at all


def test_cdx_toolkit_fetches_collinfo_once(setup: tuple[Upstream, ProxyProc], tmp_path: Path) -> None:
    up, p = setup
    code = """
        import json, cdx_toolkit
        cdx = cdx_toolkit.CDXFetcher(source="cc", crawl=["CC-MAIN-2024-20"])
        print(json.dumps([dict(c)["url"] for c in cdx.iter("example.com/*", limit=1)]))
        """
    for i in (1, 2):
        # A fresh cdx_toolkit cache each run: without the proxy's cache each run fetches collinfo.json.
        out = run_py(p, code, {"CDXT_CACHE_DIR": str(tmp_path / f"cdxt-{i}") + "/"})
        assert json.loads(out.strip().splitlines()[-1]) == ["https://example.com/page0"]
    seen = [a["path"] for a in up.log() if a["host"] == "index.commoncrawl.org"]
    assert seen.count("/collinfo.json") == 1, seen
    asked = [s for s in seen if str(s).startswith("/CC-MAIN-2024-20-index")]
    assert asked and len(asked) == len(set(asked)), seen  # each question once: the second run's are kept
