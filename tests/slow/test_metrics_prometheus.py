"""A real Prometheus scrapes a proxy under paced load; every dashboard query must return data."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy import dashboard_queries, load_dashboard, metric_names, template_variables
from tests.support.measure import results, run_clients
from tests.support.processes import free_port, need_tool, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

WINDOW = 5  # seconds: the achieved-rate gauge's window and the PromQL rate window (100 grants at 20/s)


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
            f"  - job_name: politeproxy\n    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                need_tool("prometheus"),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def loaded(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> Iterator[tuple[ProxyProc, Prometheus]]:
    proxy = proxy_factory(
        upstream,
        # the index rests 1 s after its 503 (issue 43's pacing.index_rest): the throttled request is retried
        NO_ROBOTS
        + '[schedule]\nglobal_rate = "50ms"\n[hosts."index.commoncrawl.org"]\ninterval = "0s"\n'
        + '[pacing]\nindex_rest = "1s"\n',
        env={"POLITEPROXY_RATE_WINDOW": str(WINDOW)},
    )
    prom = Prometheus(tmp_path, f"127.0.0.1:{proxy.port}")
    try:
        wait_for(prom.ready, 30, "prometheus ready")
        # Steady paced load at 20/s for WINDOW + 8 s (past the test's WINDOW + 4 s wait and its queries), plus
        # one of each event the dashboard shows.
        steady = run_clients(proxy.env, "https://data.commoncrawl.org/steady/", 20 * (WINDOW + 8), 4)
        upstream.control(
            {"throttle": {"host": "index.commoncrawl.org", "count": 1, "status": 503, "retry_after": "1"}}
        )
        assert (
            results(run_clients(proxy.env, "https://index.commoncrawl.org/throttled/", 1, 1))[0]["status"]
            == 200
        )
        import requests

        r = requests.get(
            "https://data.commoncrawl.org/cc-index/table/cc-main/x.parquet",
            headers={"Range": "bytes=0-0"},
            proxies={"https": proxy.url},
            verify=str(proxy.data_dir / "ca-bundle.pem"),
            timeout=30,
        )
        assert r.status_code in (200, 206)
        for _ in range(2):  # the second GET is a cache hit (the dashboard's cache panel)
            r = requests.get(
                "https://data.commoncrawl.org/crawl-data/CC-MAIN-2024-10/warc.paths.gz",
                proxies={"https": proxy.url},
                verify=str(proxy.data_dir / "ca-bundle.pem"),
                timeout=30,
            )
            assert r.status_code == 200
        assert "Age" in r.headers, r.headers
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        yield proxy, prom
        results(steady, timeout=120)
    finally:
        prom.stop()


def test_every_dashboard_query_returns_data_and_rates_agree(loaded: tuple[ProxyProc, Prometheus]) -> None:
    proxy, prom = loaded
    time.sleep(WINDOW + 4)  # a full window of steady load, scraped every second
    dashboard = load_dashboard()
    variables = template_variables(dashboard)
    queries = dashboard_queries(dashboard)
    empty = []
    for title, expr in queries:
        promql = re.sub(r"\$__rate_interval|\$\{__rate_interval\}|\$__interval", f"{WINDOW}s", expr)
        for name in variables:
            promql = re.sub(r"\$\{" + name + r"(?::\w+)?\}|\$" + name + r"\b", ".*", promql)
        if not prom.query(promql):
            empty.append(f"{title}: {promql}")
    assert not empty, "dashboard queries with no data:\n" + "\n".join(empty)

    gauge = float(prom.query('politeproxy_achieved_rate{scope="global"}')[0]["value"][1])
    rate = float(prom.query(f"sum(rate(politeproxy_grants_total[{WINDOW}s]))")[0]["value"][1])
    assert gauge > 15, f"steady load should be near 20/s, gauge says {gauge}"
    assert abs(gauge / rate - 1) <= 0.05, f"achieved_rate {gauge:.3f} vs rate(grants_total) {rate:.3f}"

    # Every metric the dashboard names is one the proxy exports (checked against a live /metrics).
    live = set(re.findall(r"^# TYPE (\S+) (\S+)", proxy.metrics(), re.M))
    exported: set[str] = set()
    for name, kind in live:
        exported.add(name)
        if kind == "counter":
            exported.add(name + "_total")
        if kind == "histogram":
            exported.update({name + "_bucket", name + "_sum", name + "_count"})
    used = set().union(*(metric_names(e) for _, e in queries))
    assert used <= exported, f"dashboard names metrics the proxy does not export: {used - exported}"
