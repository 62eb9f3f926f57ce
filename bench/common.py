"""Shared benchmark plumbing: certificates, the fake upstream, politeproxy, mitmdump, RSS and statistics.

Everything listens on 127.0.0.1 only. Every process started here is registered with a ``Bench`` (an
``ExitStack``) and stopped when the benchmark ends, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: find tests/

# The fake upstream, its certificates and the small process helpers are the tests' own (one copy).
from bench.stats import (  # noqa: E402 - re-exported: the scripts import them from here
    bucket_diff as bucket_diff,
)
from bench.stats import (
    bucket_quantile as bucket_quantile,
)
from bench.stats import (
    cpu_busy as cpu_busy,
)
from bench.stats import (
    fmt as fmt,
)
from bench.stats import (
    hist_buckets as hist_buckets,
)
from bench.stats import (
    histogram_quantile as histogram_quantile,
)
from bench.stats import (
    hwm_mib as hwm_mib,
)
from bench.stats import (
    log as log,
)
from bench.stats import (
    machine_note as machine_note,
)
from bench.stats import (
    median as median,
)
from bench.stats import (
    percentile as percentile,
)
from bench.stats import (
    ratio as ratio,
)
from bench.stats import (
    reset_hwm as reset_hwm,
)
from bench.stats import (
    rss_mib as rss_mib,
)
from bench.stats import (
    table as table,
)
from bench.stats import (
    wait_quiet as wait_quiet,
)
from tests.support import upstream_proc  # noqa: E402
from tests.support.processes import PY, ROOT, free_port, wait_for  # noqa: E402
from tests.support.upstream_proc import Certs, resolve_table  # noqa: E402

CACHE = Path(os.environ.get("POLITEPROXY_BENCH_CACHE") or Path.home() / ".cache" / "politeproxy-bench")
MITM_VENV = CACHE / "mitm-venv"
MITM_SPEC = os.environ.get("POLITEPROXY_BENCH_MITMPROXY", "mitmproxy")
DATA_HOST = "data.commoncrawl.org"


def port_open(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:port (mitmdump has no health endpoint)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# -- process lifetime ---------------------------------------------------------------------------------


class Bench(ExitStack):
    """A temp dir plus every process started for one benchmark; closing stops them all."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="politeproxy-bench-"))
        if not keep:
            self.callback(shutil.rmtree, self.tmp, True)

    def spawn(
        self, cmd: Sequence[str], log_name: str, cwd: Path = ROOT, **kw: Any
    ) -> subprocess.Popen[bytes]:
        logf = open(self.tmp / log_name, "wb")  # noqa: SIM115 - closed by the stack
        self.callback(logf.close)
        proc = subprocess.Popen(list(cmd), stdout=logf, stderr=subprocess.STDOUT, cwd=cwd, **kw)
        self.callback(stop, proc)
        return proc


def stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- certificates and the fake upstream -----------------------------------------------------------------


def make_certs(d: Path) -> Certs:
    """The tests' upstream CA and leaf (tests/support/upstream_proc.py)."""
    return upstream_proc.make_certs(d)


@dataclass
class Upstream(upstream_proc.Upstream):
    """The tests' fake upstream, with the certificates a client of it must trust."""

    certs: Certs | None = None

    @property
    def ca_file(self) -> Path:
        assert self.certs is not None
        return self.certs.ca_file


def start_upstream(bench: Bench, certs: Certs, files_dir: Path | None = None) -> Upstream:
    """The tests' fake upstream (tests/support/upstream_proc.py), stopped when the bench ends."""
    up = upstream_proc.start_upstream(certs, bench.tmp, files_dir)
    bench.callback(up.stop)
    return Upstream(up.proc, up.port, up.plain_port, certs)


# -- politeproxy ------------------------------------------------------------------------------------------


@dataclass
class Proxy:
    """A proxy under test: politeproxy, mitmdump or Squid. ``ca_file`` is what a client must trust through
    it; ``host`` is the authority a client asks it for (bench/squid.py: Squid's names the upstream's port)."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    ca_file: Path
    data_dir: Path | None = None
    host: str = DATA_HOST

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()


def politeproxy_config(up: Upstream, extra_toml: str = "") -> str:
    head = "[robots]\nenabled = false\n"
    upstream = f'[upstream]\nca_file = "{up.ca_file}"\n[upstream.resolve]\n{resolve_table(up)}\n'
    return f"{head}{extra_toml}\n{upstream}"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def understood_by(src: Path, extra_toml: str) -> str:
    """``extra_toml`` without the tables a source tree from before them would refuse: no [cache] before
    issue 14, no exempt ceiling before issue 12, no request window before issue 24 (measuring an old tree
    with ``--candidate``/``TREE``)."""
    if not (src / "politeproxy" / "cache").is_dir():
        extra_toml = extra_toml.replace(CACHE_OFF, "")
    if "exempt_rate" not in _read(src / "politeproxy" / "pacing" / "base.py"):
        extra_toml = extra_toml.replace(EXEMPT_CEILING_OFF, "")
    if not (src / "politeproxy" / "policy" / "window.py").is_file():
        extra_toml = extra_toml.replace(WINDOW_OFF, "")
    return extra_toml


def start_politeproxy(
    bench: Bench,
    up: Upstream,
    extra_toml: str = "",
    data_dir: Path | None = None,
    name: str = "politeproxy",
    verbose: bool = False,
    src: Path | None = None,
    run_args: Sequence[str] = (),
    module: str = "politeproxy",
    wrap: Sequence[str] = (),
    ready_within: float = 60,
    python: str = PY,
) -> Proxy:
    """``module``: what ``python -m`` runs with politeproxy's arguments (bench.traced_run: tracemalloc);
    ``wrap``: a command the process runs under (bench/instructions.py: valgrind); ``python``: the
    interpreter (a virtualenv's, with politeproxy's dependencies installed), by default this one's."""
    n = time.monotonic_ns()
    data_dir = data_dir or bench.tmp / f"data-{n}"
    cfg = bench.tmp / f"politeproxy-{n}.toml"
    port = free_port()
    cmd = [*wrap, python, "-m", module, "run", "--config", str(cfg), "--data-dir", str(data_dir)]
    cmd += ["--listen", f"127.0.0.1:{port}", *run_args] + (["-v"] if verbose else [])
    # POLITEPROXY_BENCH_SRC: run politeproxy from another source tree, to measure a candidate change.
    src = src or Path(os.environ.get("POLITEPROXY_BENCH_SRC") or ROOT)
    cfg.write_text(politeproxy_config(up, understood_by(src, extra_toml)))
    proc = bench.spawn(cmd, f"politeproxy-{n}.log", cwd=src)

    def healthy() -> bool:
        if proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return bool(json.loads(r.read())["status"] == "ok")
        except OSError:
            return False

    wait_for(healthy, ready_within, "politeproxy /healthz")
    if proc.poll() is not None:
        raise RuntimeError(f"politeproxy exited: {(bench.tmp / f'politeproxy-{n}.log').read_text()}")
    return Proxy(name, proc, port, data_dir / "ca-bundle.pem", data_dir)


# -- mitmproxy ---------------------------------------------------------------------------------------------

_REDIRECT_ADDON = '''
"""Send every upstream connection to the local fake upstream (what /etc/hosts would do)."""
import os

PORT = int(os.environ["BENCH_UPSTREAM_PORT"])


class Redirect:
    def server_connect(self, data):
        data.server.address = ("127.0.0.1", PORT)


addons = [Redirect()]
'''


def mitmdump_path(install: bool = True) -> Path | None:
    """mitmdump from its own virtualenv under the cache dir, installed from PyPI on first use."""
    exe = MITM_VENV / "bin" / "mitmdump"
    if exe.exists():
        return exe
    if not install:
        return None
    log(f"installing {MITM_SPEC} into {MITM_VENV} (once)")
    MITM_VENV.parent.mkdir(parents=True, exist_ok=True)
    base = shutil.which("python3") or PY
    subprocess.run([base, "-m", "venv", str(MITM_VENV)], check=True)
    subprocess.run([str(MITM_VENV / "bin" / "pip"), "install", "-q", MITM_SPEC], check=True)
    return exe


def start_mitmdump(bench: Bench, up: Upstream, exe: Path) -> Proxy:
    """mitmdump, quiet, streaming bodies over 1 MiB, trusting the upstream's CA; clients trust its own CA."""
    confdir = CACHE / "mitm-conf"
    confdir.mkdir(parents=True, exist_ok=True)
    addon = bench.tmp / "mitm_redirect.py"
    addon.write_text(_REDIRECT_ADDON)
    port = free_port()
    cmd = [str(exe), "-q", "--listen-host", "127.0.0.1", "--listen-port", str(port)]
    cmd += ["--set", f"confdir={confdir}", "--set", f"ssl_verify_upstream_trusted_ca={up.ca_file}"]
    cmd += ["--set", "stream_large_bodies=1m", "-s", str(addon)]
    env = {**os.environ, "BENCH_UPSTREAM_PORT": str(up.port)}
    proc = bench.spawn(cmd, f"mitmdump-{port}.log", env=env)
    wait_for(lambda: proc.poll() is not None or port_open(port), 60, "mitmdump")
    if proc.poll() is not None:
        raise RuntimeError(f"mitmdump exited: {(bench.tmp / f'mitmdump-{port}.log').read_text()}")
    ca = confdir / "mitmproxy-ca-cert.pem"
    wait_for(ca.exists, 10, "mitmproxy CA")
    return Proxy("mitmproxy", proc, port, ca)


def maybe_mitmdump(bench: Bench, up: Upstream, enabled: bool) -> Proxy | None:
    if not enabled:
        return None
    exe = mitmdump_path(install=True)
    assert exe is not None
    return start_mitmdump(bench, up, exe)


# -- comparing paths -------------------------------------------------------------------------


# The forwarding path alone: no pacing, and no cache (on by default since issue 14, it would answer the
# repeated reads of these figures from disk; bench/cache_bench.py measures the cache).
CACHE_OFF = "[cache]\nenabled = false\n"
# The exempt class's GCRA ceiling (issue 12, default 50 reads/s per host) off too: issue 15 measures the
# cost of the proxy itself, not the ceiling it keeps.
EXEMPT_CEILING_OFF = '[exempt]\nrate = "0"\n'
# And the request window (issue 24): a benchmark of the proxy itself sends more than 4,800 requests.
WINDOW_OFF = "[egress]\nlimit = 0\n"
PACING_OFF = '[schedule]\nglobal_rate = "0"\n' + CACHE_OFF + EXEMPT_CEILING_OFF + WINDOW_OFF


def add_python_arg(p: argparse.ArgumentParser) -> None:
    """--python, repeatable: the interpreters each source tree runs under, side by side (docs/benchmarks.md:
    the interpreter's build is an eighth of the CPU); none given: the one running the benchmark."""
    p.add_argument(
        "--python",
        action="append",
        default=[],
        help="an interpreter to run each tree under (repeatable; a virtualenv's python with the dependencies"
        " installed); default: this one",
    )


def tree_runs(trees: Sequence[Path], pythons: Sequence[str]) -> list[tuple[Path, str, str]]:
    """Each source tree on each interpreter of ``--python`` (none given: this one), in order, as
    (resolved tree, interpreter, label): the label names the interpreter only when some were given."""
    return [(t.resolve(), py, f"{t} ({py})" if pythons else str(t)) for t in trees for py in pythons or [PY]]


def add_compare_args(p: argparse.ArgumentParser) -> None:
    """--no-mitm and --candidate, for the figures that compare paths side by side."""
    p.add_argument("--no-mitm", action="store_true", help="skip mitmproxy (no PyPI install)")
    p.add_argument(
        "--candidate",
        type=Path,
        help="also measure politeproxy run from this source tree (a candidate change), side by side",
    )


def compared_paths(
    bench: Bench, up: Upstream, candidate: Path | None, mitm: bool
) -> list[tuple[str, Proxy | None]]:
    """The paths a figure compares, in rotation order: direct, politeproxy (pacing off), an optional
    candidate source tree, and mitmproxy when enabled."""
    pp = start_politeproxy(bench, up, PACING_OFF)
    mitmproxy = maybe_mitmdump(bench, up, mitm)
    paths: list[tuple[str, Proxy | None]] = [("direct", None), ("politeproxy", pp)]
    if candidate:
        paths.append(("candidate", start_politeproxy(bench, up, PACING_OFF, src=candidate.resolve())))
    if mitmproxy:
        paths.append(("mitmproxy", mitmproxy))
    return paths
