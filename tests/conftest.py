"""Shared fixtures: a local TLS upstream impersonating Common Crawl's hosts, and proxy processes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CC_HOSTS = (
    "data.commoncrawl.org",
    "index.commoncrawl.org",
    "commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.us-east-1.amazonaws.com",
)
OTHER_HOSTS = ("other.example", "localhost")
POLITEPROXY = [PY, "-m", "politeproxy"]
# A failure pytest cannot format is still reported as a failure (see the module).
pytest_plugins = ["tests.support.reportguard"]


def pytest_configure(config: pytest.Config) -> None:
    """The test session's environment, inherited by every process a test starts. Set here, not at import:
    bench/ imports this module's helpers and must run politeproxy as a user's install does."""
    # Every proxy a test starts runs the default transports, what a plain install gets; the optional [fast]
    # extra (aiofastnet) is installed for the tests and exercised by tests/e2e/test_fastnet_e2e.py. Under a
    # loaded two-worker run, a proxy on aiofastnet once held a freed connection place past a 10 s read
    # (test_max_connections_counts_clients_and_tunnels): not reproduced alone, recorded in the README.
    os.environ.setdefault("POLITEPROXY_FASTNET", "0")
    # Tests start Python again and again (proxies, the CLI, load clients). Where PYTHONDONTWRITEBYTECODE is
    # set (some images and shells set it), each start compiled politeproxy from source (~0.1 s of CPU a start,
    # a tenth of the quick suite). Bytecode goes to a cache outside the checkout instead, which stays clean.
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        pycache = Path(tempfile.gettempdir()) / f"politeproxy-tests-pycache-{os.getuid()}"
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(pycache))
        sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
        sys.dont_write_bytecode = False


def need_tool(name: str) -> str:
    """The path of a system tool; a test fails under CI when it is missing and skips locally."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required under CI (.ci/run installs it)")
        pytest.skip(f"{name} not installed")
    return path


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: every process a test starts ends this way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(pred: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


@dataclass
class Certs:
    ca: trustme.CA
    ca_file: Path
    server_pem: Path


def make_certs(d: Path) -> Certs:
    """The upstream's CA and leaf for every name the fake upstream answers, written into ``d``."""
    ca = trustme.CA()
    leaf = ca.issue_cert(*CC_HOSTS, *OTHER_HOSTS, "127.0.0.1")
    ca.cert_pem.write_to_path(d / "upstream-ca.pem")
    leaf.private_key_and_cert_chain_pem.write_to_path(d / "server.pem")
    return Certs(ca, d / "upstream-ca.pem", d / "server.pem")


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("upstream-certs"))


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
    cmd = [
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


@pytest.fixture
def upstream(module_upstream: Upstream) -> Upstream:
    """A fake upstream in a fresh state: the module's one server (started once per module, about 0.5 s),
    reset before each test (arrival log, throttles, robots, capacity and table delay). A test that stops
    or breaks its upstream starts its own with ``start_upstream``."""
    module_upstream.reset()
    return module_upstream


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    """A directory the ``files_upstream`` serves (under /files/ and /cc-index/table/)."""
    d = tmp_path / "files"
    d.mkdir()
    return d


@pytest.fixture
def files_upstream(certs: Certs, tmp_path: Path, files_dir: Path) -> Iterator[Upstream]:
    """A fake upstream of its own that serves the files written into ``files_dir``."""
    up = start_upstream(certs, tmp_path, files_dir=files_dir)
    yield up
    up.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_table(up: Upstream) -> str:
    lines = [f'"{h}:443" = "127.0.0.1:{up.port}"' for h in (*CC_HOSTS, *OTHER_HOSTS)]
    lines += [f'"{h}:80" = "127.0.0.1:{up.plain_port}"' for h in (*CC_HOSTS, *OTHER_HOSTS)]
    return "\n".join(lines)


@dataclass
class ProxyProc:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    config_path: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    log_mark: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 10) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read()

    def metrics(self) -> str:
        return self.get("/metrics").decode()

    def healthy(self) -> bool:
        try:
            return json.loads(self.get("/healthz", timeout=2))["status"] == "ok"
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark_log(self) -> None:
        """Remember where the log ends now: ``log_since()`` then returns only what came after."""
        self.log_mark = self.log_path.stat().st_size

    def log_since(self) -> str:
        """The log written since the last ``mark_log()`` (the whole log when never marked)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_mark)
            return f.read().decode(errors="replace")

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of the /metrics samples of ``name`` whose labels hold every part of ``labels``
        (like 'reason="auth",class="paced"'); 0 when absent. On a shared proxy compare before/after."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if key.split("{", 1)[0] == name and all(part in key for part in labels.split(",") if part):
                total += float(value)
        return total

    def sighup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        stop_process(self.proc)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def client_env(proxy_port: int, data_dir: Path) -> dict[str, str]:
    """The environment a user gets from ``eval "$(politeproxy env)"``, read from the real command: the CLI's
    ``env`` run in this process (the same code and output, without an interpreter start for every proxy;
    test_config_cli runs ``politeproxy env`` as a process)."""
    from politeproxy import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["env", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{proxy_port}"])
    out = buf.getvalue()
    assert rc == 0, f"politeproxy env exited {rc}: {out}"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            env[k] = v
    return env


def start_proxy(
    tmp: Path,
    up: Upstream | None,
    certs: Certs | None,
    extra_toml: str = "",
    data_dir: Path | None = None,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
    wait: bool = True,
    top_toml: str = "",
) -> ProxyProc:
    """Start ``politeproxy run`` in its own process with the upstream's hosts mapped to 127.0.0.1."""
    n = time.monotonic_ns()
    data_dir = data_dir or tmp / f"data-{n}"
    cfg = tmp / f"politeproxy-{n}.toml"
    text = top_toml + "\n"
    if up is not None and certs is not None:
        text += f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n{resolve_table(up)}\n'
    text += extra_toml
    cfg.write_text(text)
    port = port or free_port()
    log_path = tmp / f"proxy-{n}.log"
    cmd = [
        *POLITEPROXY,
        "run",
        "--config",
        str(cfg),
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "-v",
        *args,
    ]
    penv = {**os.environ, **(env or {})}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=penv)
    p = ProxyProc(proc, port, data_dir, cfg, log_path)
    if wait:
        wait_for(lambda: proc.poll() is not None or p.healthy(), 30, "proxy /healthz")
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited {proc.returncode}: {p.log()}")
        p.env = client_env(port, data_dir)
    return p


@pytest.fixture
def proxy_factory(tmp_path: Path, certs: Certs) -> Iterator[Callable[..., ProxyProc]]:
    started: list[ProxyProc] = []

    def make(up: Upstream | None, extra_toml: str = "", **kw: Any) -> ProxyProc:
        p = start_proxy(tmp_path, up, certs, extra_toml, **kw)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


NO_ROBOTS = "[robots]\nenabled = false\n"
# Pacing is the next layer's business: the data-path tests run it off (memory store, no global gap).
FAST = NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n'


@pytest.fixture
def proxy(proxy_factory: Callable[..., ProxyProc], upstream: Upstream) -> ProxyProc:
    """One proxy in front of the fake upstream, robots off so arrival logs hold only the test's requests."""
    return proxy_factory(upstream, NO_ROBOTS)


# -- once per module (see /work/notes/T-fixtures.md) ---------------------------------------------------
# Starting a proxy costs about a second; a module whose cases only send requests shares one. A test that
# changes config, sends SIGHUP, kills or restarts a process keeps its own (proxy_factory).


@pytest.fixture(scope="module")
def module_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that lives as long as the module (configs, data dirs and logs of module proxies)."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture(scope="module")
def module_upstream(certs: Certs, module_tmp: Path) -> Iterator[Upstream]:
    """One fake upstream for the whole module. Tests take ``shared_upstream`` (reset first) instead."""
    up = start_upstream(certs, module_tmp)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def module_files_dir(module_tmp: Path) -> Path:
    """``files_dir`` once per module (tests write files of distinct names into it)."""
    d = module_tmp / "files"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def module_files_upstream(certs: Certs, module_tmp: Path, module_files_dir: Path) -> Iterator[Upstream]:
    """``files_upstream`` once per module, serving ``module_files_dir``. Call ``reset()`` in each test."""
    up = start_upstream(certs, module_tmp, files_dir=module_files_dir)
    yield up
    up.stop()


@pytest.fixture
def shared_upstream(module_upstream: Upstream) -> Upstream:
    """The module's upstream with an empty arrival log and no throttle, robots or capacity rule."""
    module_upstream.reset()
    return module_upstream


@pytest.fixture(scope="module")
def module_proxy_factory(module_tmp: Path, certs: Certs) -> Iterator[Callable[..., ProxyProc]]:
    """``proxy_factory``'s call, but each proxy it starts lives until the module ends."""
    started: list[ProxyProc] = []

    def make(up: Upstream | None, extra_toml: str = "", **kw: Any) -> ProxyProc:
        p = start_proxy(module_tmp, up, certs, extra_toml, **kw)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


@pytest.fixture(scope="module")
def module_proxy(module_proxy_factory: Callable[..., ProxyProc], module_upstream: Upstream) -> ProxyProc:
    """``proxy`` once per module: robots off, in front of ``module_upstream``. Use with shared_upstream."""
    return module_proxy_factory(module_upstream, NO_ROBOTS)


def for_this_test(p: ProxyProc) -> ProxyProc:
    """A module's proxy handed to one more test: checked alive, its log marked for ``log_since()``."""
    assert p.proc.poll() is None, f"the module's proxy died: {p.log()[-2000:]}"
    p.mark_log()
    return p


@pytest.fixture(scope="module")
def module_fast_proxy(module_proxy_factory: Callable[..., ProxyProc], module_upstream: Upstream) -> ProxyProc:
    """A FAST proxy (memory store, no global gap, robots off) in front of ``module_upstream``, per module."""
    return module_proxy_factory(module_upstream, FAST)


@pytest.fixture
def shared_fast_proxy(module_fast_proxy: ProxyProc) -> ProxyProc:
    """``module_fast_proxy`` for one test (checked alive, log marked)."""
    return for_this_test(module_fast_proxy)


@pytest.fixture
def shared_proxy(module_proxy: ProxyProc) -> ProxyProc:
    """``module_proxy``, checked alive, its log marked so ``log_since()`` shows only this test's lines."""
    return for_this_test(module_proxy)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The folder says what a test is: everything under tests/slow/ is ``slow``, everything under
    tests/faults/ is ``faults`` and ``slow`` (so ``pytest -m "not slow"`` is the quick run)."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "slow" in parts or "faults" in parts:
            item.add_marker(pytest.mark.slow)
        if "faults" in parts:
            item.add_marker(pytest.mark.faults)
