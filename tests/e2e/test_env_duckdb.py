"""duckdb with the exact `# duckdb:` lines of `politeproxy env` (issue 13 item 6): certificate verification
on, an absolute ca_cert_file, and a read through the proxy that verifies and succeeds, while the same
lines with a bundle that lacks the proxy's CA fail (so verification is really on).
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from tests.support.processes import POLITEPROXY, PY, ROOT
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pytestmark = pytest.mark.slow  # two duckdb processes with httpfs: about 5 s
pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb_ext")


@pytest.fixture(scope="module")
def served(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProc, Upstream]]:
    tmp = tmp_path_factory.mktemp("duckdb env")
    files = tmp / "files"
    files.mkdir()
    table = pa.table({"n": list(range(100))})
    pq.write_table(table, files / "t.parquet", row_group_size=50)
    up = start_upstream(certs, tmp, files_dir=files)
    # A data dir with a space: the SQL string must carry it whole.
    p = start_proxy(
        tmp,
        up,
        certs,
        NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n',
        data_dir=tmp / "my data",
    )
    yield p, up
    p.stop()
    up.stop()


def duckdb_lines(p: ProxyProc) -> list[str]:
    out = subprocess.run(
        [*POLITEPROXY, "env", "--data-dir", str(p.data_dir), "--listen", f"127.0.0.1:{p.port}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return [x[len("# duckdb: ") :] for x in out.splitlines() if x.startswith("# duckdb: ")]


def run_duckdb(statements: str, url: str) -> subprocess.CompletedProcess[str]:
    """Run the SET statements as printed, then read ``url``; a fresh process (no proxy variables)."""
    code = textwrap.dedent(
        f"""
        import duckdb, duckdb_ext
        ext_dir = list(duckdb_ext.__path__)[0] + "/extensions"
        con = duckdb.connect(config={{"autoinstall_known_extensions": False}})
        con.execute(f"SET extension_directory = '{{ext_dir}}'")
        con.execute("LOAD httpfs")
        for stmt in {statements!r}.split(";"):
            if stmt.strip():
                con.execute(stmt)
        print(con.execute("SELECT current_setting('enable_server_cert_verification')").fetchone()[0])
        print(con.execute("SELECT count(*), sum(n) FROM read_parquet('{url}')").fetchone())
        """
    )
    return subprocess.run(
        [PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin"}
    )


def test_the_printed_duckdb_lines_verify_and_read(served: tuple[ProxyProc, Upstream]) -> None:
    """The lines turn verification on and name an absolute bundle; with them duckdb reads a parquet file
    through the proxy, which the upstream's arrival log shows."""
    p, up = served
    lines = duckdb_lines(p)
    sql = lines[0]
    assert "SET enable_server_cert_verification = true;" in sql
    bundle = str(p.data_dir / "trust-bundle.pem")
    assert (
        f"SET ca_cert_file = '{bundle.replace(chr(39), chr(39) * 2)}';" in sql and Path(bundle).is_absolute()
    )
    r = run_duckdb(sql, "https://data.commoncrawl.org/cc-index/table/t.parquet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "True" and "(100, 4950)" in r.stdout, r.stdout
    assert any(a["path"] == "/cc-index/table/t.parquet" for a in up.log())


def test_verification_is_really_on(served: tuple[ProxyProc, Upstream], tmp_path: Path) -> None:
    """The same lines with certifi's bundle (no proxy CA) in place of ours fail: duckdb checks the leaf."""
    p, _ = served
    sql = duckdb_lines(p)[0]
    bundle = str(p.data_dir / "trust-bundle.pem").replace("'", "''")
    wrong = sql.replace(bundle, certifi.where())
    assert wrong != sql
    r = run_duckdb(wrong, "https://data.commoncrawl.org/cc-index/table/t.parquet")
    assert r.returncode != 0, r.stdout
    assert "SSL server verification failed" in r.stderr, r.stderr
