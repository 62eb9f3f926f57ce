"""A politeproxy process a test starts: ``start_proxy``, the ``ProxyProc`` handle (URL, /metrics, its log),
the client environment ``politeproxy env`` gives, and the configs most tests run (``NO_ROBOTS``, ``FAST``).

(tests/conftest.py holds the fixtures built on them; it registers this module for pytest's assertion
rewriting, as its asserts were when they lived in conftest.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tests.support.processes import POLITEPROXY, ROOT, free_port, stop_process, wait_for
from tests.support.upstream_proc import Certs, Upstream, resolve_table

NO_ROBOTS = "[robots]\nenabled = false\n"
# Pacing is the next layer's business: the data-path tests run it off (memory store, no global gap).
FAST = NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n'


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
    from politeproxy.commands import cli

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


# Every proxy process a test started, with the test that started it: each module's end stops and names any
# still running (``leftover_proxies``), so a test that forgets its proxies is seen, not left to eat the CPU.
STARTED: list[tuple[str, subprocess.Popen[bytes]]] = []


def leftover_proxies(since: int = 0) -> list[str]:
    """Stop every proxy started since ``STARTED[since]`` that still runs; the tests that started them."""
    mine = STARTED[since:]
    left = [who for who, proc in mine if proc.poll() is None]
    for _who, proc in mine:
        stop_process(proc)
    return left


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
    # free_port() hands out a port that is free now; another test's proxy may bind it first. Then this one
    # cannot listen, and the port answers /healthz for the other: once a test sent its requests to another
    # test's proxy (its CA unknown to the client). So the answer must be this proxy's (its CA), and a port
    # lost that way is tried again with another.
    for _ in range(3):
        p = _launch(tmp, cfg, data_dir, args, env, port or free_port(), n)
        if not wait:
            return p
        wait_for(partial(up_or_gone, p), 30, "proxy /healthz")
        if p.proc.poll() is None:
            p.env = client_env(p.port, data_dir)
            return p
        if port is not None or "in use" not in p.log().lower():
            break
    raise RuntimeError(f"proxy exited {p.proc.returncode}: {p.log()}")


def _launch(
    tmp: Path, cfg: Path, data_dir: Path, args: tuple[str, ...], env: dict[str, str] | None, port: int, n: int
) -> ProxyProc:
    log_path = tmp / f"proxy-{n}-{port}.log"
    listen = f"127.0.0.1:{port}"
    cmd = [
        *POLITEPROXY,
        "run",
        "--config",
        str(cfg),
        "--data-dir",
        str(data_dir),
        "--listen",
        listen,
        "-v",
        *args,
    ]
    penv = {**os.environ, **(env or {})}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=penv)
    STARTED.append((os.environ.get("PYTEST_CURRENT_TEST", "?"), proc))
    return ProxyProc(proc, port, data_dir, cfg, log_path)


def up_or_gone(p: ProxyProc) -> bool:
    return p.proc.poll() is not None or answers_as_itself(p)


def answers_as_itself(p: ProxyProc) -> bool:
    """/healthz says ok, and /ca.pem is the CA in the proxy's own data dir: the port is this proxy's."""
    return answers_as(p.port, p.data_dir)


def answers_as(port: int, data_dir: Path) -> bool:
    """``answers_as_itself`` for a proxy known by its port and data dir (quiet_proxy's too)."""
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
            if json.loads(r.read())["status"] != "ok":
                return False
        with urllib.request.urlopen(f"{base}/ca.pem", timeout=2) as r:
            return bool(r.read() == (data_dir / "ca.pem").read_bytes())
    except OSError:
        return False


def for_this_test(p: ProxyProc) -> ProxyProc:
    """A module's proxy handed to one more test: checked alive, its log marked for ``log_since()``."""
    assert p.proc.poll() is None, f"the module's proxy died: {p.log()[-2000:]}"
    p.mark_log()
    return p
