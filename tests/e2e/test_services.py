"""Limits per service, not per host name (issue 24), counted from the upstream's arrival log: every name of
the bucket (virtual-hosted, regional, dualstack, path-style) shares one exempt ceiling, and range reads of
the columnar index on index.commoncrawl.org keep that host's interval (the default exempt rule covers the
data distribution and the bucket only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import trustme

from tests.support.measure import budget_bound, busiest_window
from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import CC_HOSTS, OTHER_HOSTS, Certs, Upstream, start_upstream

RATE = 0.1  # exempt.rate: 10 reads/s per service
BURST = 3
LATE = 0.05  # a granted read may reach the upstream this late (the proxy's leg on a noisy 2-core box)
GAP_LATE = 0.1  # seconds a gap between arrivals may come short (see the index test)
INTERVAL = 0.3  # index.commoncrawl.org's interval here (1 s by default), short to keep the test quick
TABLE = "/cc-index/table/cc-main/warc/part-0.parquet"
DUALSTACK = "commoncrawl.s3.dualstack.us-east-1.amazonaws.com"
# (the name the client tunnels to, the path it asks for): four names of one bucket
BUCKET_NAMES = (
    ("commoncrawl.s3.amazonaws.com", TABLE),
    ("commoncrawl.s3.us-east-1.amazonaws.com", TABLE),
    (DUALSTACK, TABLE),
    ("s3.amazonaws.com", "/commoncrawl" + TABLE),  # path-style, intercepted with intercept_s3_path_style
)


@pytest.fixture(scope="module")
def names_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """The upstream's usual names plus the bucket's dualstack name and S3's path-style endpoint."""
    d = tmp_path_factory.mktemp("services-certs")
    ca = trustme.CA()
    leaf = ca.issue_cert(*CC_HOSTS, *OTHER_HOSTS, DUALSTACK, "s3.amazonaws.com", "127.0.0.1")
    ca.cert_pem.write_to_path(d / "upstream-ca.pem")
    leaf.private_key_and_cert_chain_pem.write_to_path(d / "server.pem")
    return Certs(ca, d / "upstream-ca.pem", d / "server.pem")


@pytest.fixture(scope="module")
def up(names_certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = start_upstream(names_certs, tmp_path_factory.mktemp("services-up"))
    yield u
    u.stop()


@pytest.fixture
def proxy(up: Upstream, names_certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    up.reset()
    resolve = {f"{h}:443": f"127.0.0.1:{up.port}" for h in (DUALSTACK, "s3.amazonaws.com")}
    text = (
        NO_ROBOTS
        + '[schedule]\nbackend = "memory"\nglobal_rate = "10ms"\n'
        + f'[exempt]\nrate = "{RATE}s"\nburst = {BURST}\nmax_in_flight = 16\n'
        + f'[hosts."index.commoncrawl.org"]\ninterval = "{INTERVAL}s"\n'
        + "[cache]\nenabled = false\n"  # repeated ranges: the pacing is measured, not the cache
        + upstream_toml(up, names_certs, resolve)
    )
    top = "intercept_s3_path_style = true\n"
    p = start_proxy(tmp_path_factory.mktemp("services-proxy"), None, None, text, top_toml=top)
    yield p
    p.stop()


def _read_for(env: dict[str, str], targets: list[tuple[str, str]], seconds: float, threads: int) -> list[int]:
    """``threads`` readers per target, each sending range reads without pause for ``seconds``."""
    stop = time.monotonic() + seconds
    statuses: list[int] = []
    lock = threading.Lock()

    def reader(host: str, path: str, n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            got = tunnel_get(env, host, f"{path}?r={n}-{i}", {"Range": f"bytes={i}-{i + 9}"})[0]
            with lock:
                statuses.append(got)
            i += 1

    jobs = [(h, p, k * threads + j) for k, (h, p) in enumerate(targets) for j in range(threads)]
    with ThreadPoolExecutor(len(jobs)) as ex:
        for f in [ex.submit(reader, *job) for job in jobs]:
            f.result(60)
    return statuses


@pytest.mark.slow  # 2.5 s of range reads
def test_every_name_of_the_bucket_shares_one_exempt_ceiling(proxy: ProxyProc, up: Upstream) -> None:
    """Per host name the four names would get four ceilings: 4 x (10 + 3) reads in the first second."""
    # Warm first: a cold start's reads each wait for an upstream TLS connect (0.1 s on a loaded box), so the
    # burst arrived late and the span came short by as much (31 reads in 2.60 s against 30.5 once). The
    # warm-up's reads take the ceiling; BURST * RATE of quiet gives it back, and the log starts after.
    _read_for(proxy.env, list(BUCKET_NAMES), 0.5, threads=2)
    time.sleep(BURST * RATE + 0.2)
    up.reset()
    statuses = _read_for(proxy.env, list(BUCKET_NAMES), 2.5, threads=2)
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    log = [a for a in up.log() if TABLE in a["path"]]
    assert {a["host"] for a in log} >= {h for h, _ in BUCKET_NAMES[:3]}, {a["host"] for a in log}
    ts = sorted(a["t"] for a in log)
    # A GCRA window of 1 s holds the burst plus a rate's worth; a late grant may shift one more in.
    bound = budget_bound(1 / RATE, 1.0, LATE) + BURST - 1
    start, most = busiest_window(ts, 1.0)
    assert most <= bound, f"{most} reads in the 1 s from {start:.3f} across the bucket's names; bound {bound}"
    span = ts[-1] - ts[0]
    assert len(ts) <= BURST + (span + LATE) / RATE + 1, (len(ts), span)
    assert len(ts) >= 0.6 * span / RATE, (len(ts), span)  # loosely: the ceiling, not the readers, set it


@pytest.mark.slow  # 2 s of reads at the index's 1 s interval
def test_range_reads_to_the_index_server_keep_its_interval(proxy: ProxyProc, up: Upstream) -> None:
    """index.commoncrawl.org is one pywb server: a range read of /cc-index/table/ there is paced."""
    _read_for(proxy.env, [("index.commoncrawl.org", TABLE)], 2.0, threads=3)
    ts = sorted(a["t"] for a in up.log() if a["host"] == "index.commoncrawl.org" and TABLE in a["path"])
    assert len(ts) >= 4, ts
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    # The late-grant rule: an arrival that lags its grant may be followed by the next on time, so a gap may
    # come up to GAP_LATE short (20 ms has held here so far; the same bound on the index's 1 s interval in
    # test_gaps_layout failed once in CI, at 71 ms). With the exempt rule on the index the gaps were 0.006 s.
    assert min(gaps) >= INTERVAL - GAP_LATE, [round(g, 3) for g in gaps]
