"""The client workloads the figures share: a curl download (bulk, cache) and a duckdb scan of a parquet
file shaped like Common Crawl's columnar index (duckdb_scan, cache). One home, so the figure scripts import
it and not each other.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA_HOST, PY, ROOT, Proxy  # noqa: E402


def curl_download(url: str, size: int, cafile: Path, proxy: Proxy | None, up_port: int) -> float:
    """Bytes per second, as curl measured them; raises unless the whole body arrived."""
    curl = shutil.which("curl")
    if curl is None:
        raise SystemExit("curl is required")
    cmd = [curl, "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{speed_download}"]
    cmd += ["--cacert", str(cafile), "--max-time", "600"]
    if proxy:
        cmd += ["-x", proxy.url]
    else:
        cmd += ["--connect-to", f"{DATA_HOST}:443:127.0.0.1:{up_port}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=700)
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 3 or parts[0] != "200" or int(parts[1]) != size:
        raise RuntimeError(f"download failed: rc={out.returncode} {out.stdout!r} {out.stderr[-500:]!r}")
    return float(parts[2])


TABLE_PATH = "/cc-index/table/cc-main/warc/crawl=CC-MAIN-BENCH/subset=warc/part-00000.parquet"
QUERY = (
    "SELECT url_host_name, count(*) AS n, sum(warc_record_length) AS bytes FROM read_parquet('{url}') "
    "WHERE fetch_status = 200 GROUP BY url_host_name ORDER BY n DESC LIMIT 5"
)

CLIENT = r"""
import json, sys, time
import duckdb
from pathlib import Path
import duckdb_ext
url, proxy, ca, query = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ext = next(Path(list(duckdb_ext.__path__)[0]).glob("extensions/v*/*/httpfs.duckdb_extension"))
con = duckdb.connect()
con.execute(f"LOAD '{ext}'")
if proxy:
    con.execute(f"SET http_proxy = '{proxy}'")
con.execute(f"SET ca_cert_file = '{ca}'")
con.execute("SET enable_http_metadata_cache = false")
t0 = time.perf_counter()
rows = con.execute(query.format(url=url)).fetchall()
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": len(rows), "top": rows[0][1]}))
"""


def write_parquet(path: Path, rows: int, row_group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    hosts = [f"host{i % 997}.example.com" for i in range(rows)]
    t = pa.table(
        {
            "url": [f"https://{h}/path/{i}/page.html?q={i * 7919 % 100003}" for i, h in enumerate(hosts)],
            "url_host_name": hosts,
            "fetch_status": pa.array([200 if i % 10 else 404 for i in range(rows)], pa.int16()),
            "warc_record_length": pa.array([(i * 2654435761) % 200000 for i in range(rows)], pa.int64()),
            "content_mime_type": ["text/html" if i % 3 else "application/pdf" for i in range(rows)],
        }
    )
    pq.write_table(t, path, row_group_size=row_group, compression="zstd")


def run_query(url: str, proxy: Proxy | None, ca: Path) -> dict:
    cmd = [PY, "-c", CLIENT, url, proxy.url.removeprefix("http://") if proxy else "", str(ca), QUERY]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"duckdb failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
