"""duckdb 1.5 with its offline httpfs package (issue 26), set up as docs/tools.md says: `eval` the lines of
`politeproxy env`, then `SET ca_cert_file`. duckdb 1.5 reads httpfs over curl and takes its proxy from the
proxy variables itself, so no `SET http_proxy` is needed; curl verifies the upstream by default but reads
neither SSL_CERT_FILE nor CURL_CA_BUNDLE, so the bundle is named in SQL.

What these tests saw (duckdb 1.5.5), and the docs say: a proxy URL with a user name (what `env --pipeline`
exports) or with `https://` is refused before any request ("Failed to parse http_proxy ... into a host and
port"); with a pipeline, the printed `# duckdb:` lines (`SET http_proxy = 'HOST:PORT'` and the user name and
password as settings) override the variable and count the reads under the name.

duckdb 1.5 lives beside the test venv's 1.4.4, in its own directory (`make test` installs it: see the
Makefile's duckdb15 step); each test runs one interpreter with PYTHONPATH set to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import certifi
import pytest

from tests.support.clients import env_output
from tests.support.processes import PY, ROOT, wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import ProxyFactory, arrivals, start_with
from tests.support.upstream_proc import Certs, Upstream

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# The Makefile installs duckdb 1.5 and its httpfs package here (pip install --target), beside the venv's 1.4.
DUCKDB15 = Path(sys.prefix) / "duckdb15"
HTTPFS = sorted(DUCKDB15.glob("duckdb_extension_httpfs/extensions/v1.5.*/httpfs.duckdb_extension"))
if not HTTPFS:
    where = DUCKDB15.relative_to(ROOT) if DUCKDB15.is_relative_to(ROOT) else DUCKDB15
    pytest.skip(
        f"duckdb 1.5 is not installed in {DUCKDB15}: run `make {where}/.installed` (make test does)",
        allow_module_level=True,
    )

TABLE = "/cc-index/table/d15-{}.parquet"  # one object per test: the proxy's cache would answer a second read
PARSE_ERROR = "Failed to parse http_proxy"

# Runs each case on a fresh connection after setting the proxy variables (as a shell's eval left them, or
# replaced by the case's); prints one JSON line per case: the rows read, or the error's first line.
RUNNER = """
import json, os, sys, duckdb
assert duckdb.__version__.startswith("1.5."), duckdb.__version__
httpfs, url, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for name, proxy_url, statements in cases:
    if proxy_url:
        for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            os.environ[k] = proxy_url
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute("LOAD '" + httpfs.replace("'", "''") + "'")
    try:
        for stmt in statements:
            con.execute(stmt)
        got = list(con.execute(f"SELECT count(*), sum(n) FROM read_parquet('{url}')").fetchone())
    except duckdb.Error as e:
        got = str(e).splitlines()[0]
    con.close()
    print(json.dumps([name, got]))
"""


@pytest.fixture(scope="module")
def module_d15(
    module_proxy_factory: ProxyFactory, module_files_upstream: Upstream, module_files_dir: Path, certs: Certs
) -> ProxyProc:
    for name in ("env", "pipeline"):
        table = module_files_dir / TABLE.format(name).removeprefix("/cc-index/table/")
        pq.write_table(pa.table({"n": list(range(100))}), table, row_group_size=50)
    return start_with(module_proxy_factory, module_files_upstream, certs)


@pytest.fixture
def d15(module_d15: ProxyProc, module_files_upstream: Upstream) -> ProxyProc:
    module_files_upstream.reset()
    return for_this_test(module_d15)


def duckdb15(env_out: str, path: str, cases: list[tuple[str, str, list[str]]]) -> dict[str, object]:
    """`eval "$(politeproxy env ...)"` in bash, then duckdb 1.5 in that shell, one connection per case."""
    script = 'eval "$ENV_OUT" && exec "$PY" -c "$RUNNER" "$HTTPFS" "$URL" "$CASES"'
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(DUCKDB15), "ENV_OUT": env_out, "PY": PY}
    env |= {
        "RUNNER": textwrap.dedent(RUNNER),
        "HTTPFS": str(HTTPFS[-1]),
        "URL": f"https://data.commoncrawl.org{path}",
        "CASES": json.dumps(cases),
    }
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return {name: got for name, got in map(json.loads, r.stdout.splitlines())}


def sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def access_lines(p: ProxyProc, path: str, n: int) -> list[str]:
    """This test's access-log lines for ``path`` (at least ``n``: a line is written as its answer ends)."""
    got: list[str] = []

    def enough() -> bool:
        got[:] = [x for x in p.log_since().splitlines() if f" data.commoncrawl.org{path} " in x]
        return len(got) >= n

    wait_for(enough, 10, f"{n} access-log lines for {path}")
    return got


def upstream_reads(up: Upstream, path: str) -> list[dict[str, object]]:
    return [a for a in arrivals(up) if a["path"] == path]


def test_the_env_lines_and_ca_cert_file_read_parquet(d15: ProxyProc, module_files_upstream: Upstream) -> None:
    """The env lines plus `SET ca_cert_file` read the file through the proxy (the upstream's arrival log has
    the range reads; the name resolves nowhere else), and a bundle without the proxy's CA fails, though
    enable_server_cert_verification stays off: curl verifies by itself."""
    bundle = str(d15.data_dir / "trust-bundle.pem")
    path = TABLE.format("env")
    got = duckdb15(
        env_output(d15),
        path,
        [
            ("ours", "", [f"SET ca_cert_file = {sql(bundle)}"]),
            ("no bundle", "", []),  # SSL_CERT_FILE and CURL_CA_BUNDLE are set: curl reads neither
            ("certifi's", "", [f"SET ca_cert_file = {sql(certifi.where())}"]),
        ],
    )
    assert got["ours"] == [100, 4950], got
    for case in ("no bundle", "certifi's"):
        assert "SSL peer certificate" in str(got[case]), got
    seen = upstream_reads(module_files_upstream, path)
    assert len(seen) >= 2 and any(a["range"] for a in seen), seen
    lines = access_lines(d15, path, len(seen))
    assert all(" pipeline=127.0.0.1 " in x for x in lines), lines


def test_a_pipeline_needs_the_printed_duckdb_lines(d15: ProxyProc, module_files_upstream: Upstream) -> None:
    """duckdb 1.5 refuses the `NAME:x@` URL that `env --pipeline` exports, and an https:// proxy URL, before
    sending anything; the `# duckdb:` lines of the same output override it and count the reads as NAME."""
    out = env_output(d15, "--pipeline", "duck15")
    lines = [x.removeprefix("# duckdb: ") for x in out.splitlines() if x.startswith("# duckdb: ")]
    printed = [s.strip() for line in lines for s in line.split(";") if s.strip()]
    assert any(s.startswith("SET http_proxy_username") for s in printed), printed
    bundle = f"SET ca_cert_file = {sql(str(d15.data_dir / 'trust-bundle.pem'))}"
    https_url = f"https://127.0.0.1:{d15.port}"
    path = TABLE.format("pipeline")
    got = duckdb15(
        out,
        path,
        [
            ("env alone", "", [bundle]),
            ("duckdb lines", "", printed),
            ("https url", https_url, [bundle]),
        ],
    )
    assert PARSE_ERROR in str(got["env alone"]) and "duck15:x@" in str(got["env alone"]), got
    assert got["duckdb lines"] == [100, 4950], got
    assert PARSE_ERROR in str(got["https url"]), got
    seen = upstream_reads(module_files_upstream, path)
    assert len(seen) >= 2, seen  # from the "duckdb lines" case alone: the other two sent nothing
    lines = access_lines(d15, path, len(seen))
    assert all(" pipeline=duck15 " in x for x in lines), lines
