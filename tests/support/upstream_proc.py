"""The fake upstream (tests/support/fakeupstream.py) as a process a test starts: its certificates, the
handle a test drives it through, and the resolve table that maps Common Crawl's hosts to it.

(tests/conftest.py holds the fixtures built on them.)
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from tests.support.processes import PY, ROOT, wait_for

CC_HOSTS = (
    "data.commoncrawl.org",
    "index.commoncrawl.org",
    "commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.us-east-1.amazonaws.com",
)
OTHER_HOSTS = ("other.example", "localhost")
# The other concrete paced names (HostSet.concrete_hosts, path-style on): a proxy looks each up for
# allow_ip_connect (proxy/door/pacedaddrs.py) unless the resolve table maps it on ports 443 and 80. Mapped
# here, so no test reads the machine's /etc/hosts or DNS for a Common Crawl name (issue 42, item 11).
PACED_NAMES = ("commoncrawl.s3-external-1.amazonaws.com", "s3.amazonaws.com", "s3-external-1.amazonaws.com")


@dataclass
class Certs:
    ca: trustme.CA
    ca_file: Path
    server_pem: Path


def make_certs(d: Path) -> Certs:
    """The upstream's CA and leaf for every name the fake upstream answers, written into ``d``."""
    ca = trustme.CA()
    leaf = ca.issue_cert(*CC_HOSTS, *OTHER_HOSTS, *PACED_NAMES, "127.0.0.1")
    ca.cert_pem.write_to_path(d / "upstream-ca.pem")
    leaf.private_key_and_cert_chain_pem.write_to_path(d / "server.pem")
    return Certs(ca, d / "upstream-ca.pem", d / "server.pem")


@dataclass
class Upstream:
    proc: subprocess.Popen[bytes]
    port: int
    plain_port: int

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.plain_port}{path}"

    def log(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self._url("/__log"), timeout=10) as r:
            return [json.loads(line) for line in r.read().decode().splitlines() if line]

    def control(self, cmd: dict[str, Any]) -> None:
        req = urllib.request.Request(
            self._url("/__control"),
            data=json.dumps(cmd).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def reset(self) -> None:
        self.control({"reset": True})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_upstream(certs: Certs, tmp: Path, files_dir: Path | None = None) -> Upstream:
    port_file = tmp / f"upstream-port-{time.monotonic_ns()}"
    # The arrival log is the rate tests' instrument: an arrival is stamped when the upstream's loop reads it,
    # so an upstream descheduled for 0.4 s on make test's shared 2-core box stamped 20 arrivals within a
    # millisecond after a 0.4 s gap, a burst that never left the proxies (each holds one claimed slot at
    # most). At nice -10 it preempts the suite's nice-0 processes when a request comes in. Without the
    # privilege (not root) nice says so on stderr and runs it at the usual priority.
    cmd = [
        "nice",
        "-n",
        "-10",
        PY,
        "-m",
        "tests.support.fakeupstream",
        "--cert",
        str(certs.server_pem),
        "--port-file",
        str(port_file),
        "--plain-port",
        "0",
    ]
    if files_dir:
        cmd += ["--files-dir", str(files_dir)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    wait_for(lambda: port_file.exists() or proc.poll() is not None, what="fake upstream")
    if proc.poll() is not None:
        raise RuntimeError("fake upstream failed to start")
    tls, plain = map(int, port_file.read_text().split())
    return Upstream(proc, tls, plain)


def resolve_table(up: Upstream) -> str:
    names = (*CC_HOSTS, *OTHER_HOSTS, *PACED_NAMES)
    lines = [f'"{h}:443" = "127.0.0.1:{up.port}"' for h in names]
    lines += [f'"{h}:80" = "127.0.0.1:{up.plain_port}"' for h in names]
    return "\n".join(lines)
