"""Behaviours that had no test of their own: blind-tunnel flow control, the index host's 1 s default
interval, and JSON logs from the first line."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.processes import POLITEPROXY, ROOT, free_port, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import connect_tunnel, proc_mem_kib
from tests.support.upstream_proc import Certs, Upstream


@pytest.mark.slow  # a 3 s stall of a reader, by design
def test_blind_tunnel_applies_flow_control(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, certs: Certs
) -> None:
    """A client that stops reading a 512 MiB answer through a blind tunnel must stall the upstream,
    not make the proxy buffer it: the proxy's RSS stays flat while the client reads nothing."""
    p = proxy_factory(upstream, NO_ROBOTS)
    s, head = connect_tunnel(p.port, "other.example:443")
    assert head.startswith(b"HTTP/1.1 200"), head
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    tls = ctx.wrap_socket(s, server_hostname="other.example")
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    size = 512 * 1024 * 1024
    tls.sendall(f"GET /size/{size} HTTP/1.1\r\nHost: other.example\r\n\r\n".encode())
    tls.recv(65536)  # the answer has started
    before = proc_mem_kib(p.proc.pid)["VmRSS"]
    time.sleep(3.0)  # the client reads nothing; an unthrottled relay would buffer hundreds of MiB here
    after = proc_mem_kib(p.proc.pid)["VmRSS"]
    grew_mib = (after - before) / 1024
    assert grew_mib < 32, f"RSS grew {grew_mib:.1f} MiB while the tunnel's client read nothing"
    got = 0
    while got < 8 * 1024 * 1024:  # and the tunnel still flows once the client reads again
        chunk = tls.recv(1 << 16)
        assert chunk, "the tunnel closed"
        got += len(chunk)
    tls.close()


@pytest.mark.slow  # a rate: requests at 1 per second
def test_index_host_defaults_to_one_request_a_second(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """Without a [hosts] table, index.commoncrawl.org gets its 1 s interval while the global gap is
    20 ms: four requests sent at once reach it at least a second apart (the upper bound, strictly)."""
    p = proxy_factory(upstream, NO_ROBOTS + '[schedule]\nglobal_rate = "20ms"\n')
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            r = subprocess.run(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}"]
                + [f"https://index.commoncrawl.org/echo?i={i}"],
                env=p.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert r.stdout == "200", r.stderr
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    times = sorted(a["t"] for a in upstream.log() if a["host"] == "index.commoncrawl.org")
    assert len(times) == 4
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # Grants are exactly 1 s apart, and the schedule is kept: an arrival that lags its grant (the first
    # opens a new upstream TLS connection; a busy loop) may be followed by the next one on time, so a gap
    # and the span may each come up to LATE short (the late-grant rule, docs/testing.md).
    # 50 ms failed once in CI at 71 ms (gaps 0.93, 1.00, 1.00), and 0.15 s once in a clean-clone .ci/run at
    # 0.19 s (gaps 1.00, 1.19, 0.84: the third arrival late, the fourth on its slot), so the allowance is the
    # box's documented 100-200 ms of late grants (docs/testing.md). Without the interval the four would
    # arrive 20 ms apart (the global gap), and at half the interval 0.5 s apart: 0.8 s still proves it, and
    # the span below (at least 2.8 s for the four) fails any interval under 0.93 s.
    late = 0.2
    assert min(gaps) >= 1.0 - late, f"index.commoncrawl.org arrivals {gaps} are closer than its 1 s interval"
    assert times[-1] - times[0] >= 3.0 - late, f"four index lookups within {times[-1] - times[0]:.2f}s"


def test_json_logs_are_json_from_the_first_line(tmp_path: Path) -> None:
    """--log-format json: every line on stderr, from the first, is one JSON object (with and without -v)."""
    for verbose in ([], ["-v"]):
        port = free_port()
        proc = subprocess.Popen(
            [*POLITEPROXY, "run", "--log-format", "json", "--data-dir", str(tmp_path / "d")]
            + ["--listen", f"127.0.0.1:{port}", "--global-rate", "200ms", *verbose],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            first = proc.stderr.readline()
            wait_for(lambda port=port: _answers(port), 30, "proxy")
        finally:
            proc.terminate()
            _, rest = proc.communicate(timeout=15)
        lines = [first, *rest.splitlines()]
        assert [ln for ln in lines if ln.strip()], "nothing was logged"
        for line in lines:
            if line.strip():
                assert isinstance(json.loads(line), dict), line


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
