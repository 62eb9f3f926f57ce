"""A proxy started the way a user starts it: ``politeproxy run`` without -v (its start-up lines are the
ones a user sees)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.support.processes import POLITEPROXY, ROOT, free_port, stop_process, wait_for
from tests.support.upstream_proc import Certs, Upstream, resolve_table


@dataclass
class Quiet:
    """A proxy started the way a user starts it: no -v."""

    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    def stop(self) -> None:
        stop_process(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def upstream_toml(up: Upstream, certs: Certs) -> str:
    return f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n{resolve_table(up)}\n'


def run_quiet(
    tmp: Path,
    up: Upstream | None,
    certs: Certs | None,
    toml: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> Quiet:
    """`politeproxy run` without -v, in front of ``up`` when given; waits until /healthz answers."""
    cfg = tmp / "quiet.toml"
    cfg.write_text(toml + (upstream_toml(up, certs) if up and certs else ""))
    port, data_dir, log_path = free_port(), tmp / "data", tmp / "quiet.log"
    cmd = [*POLITEPROXY, "run", "--config", str(cfg), "--data-dir", str(data_dir)]
    cmd += ["--listen", f"127.0.0.1:{port}", *args]
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    q = Quiet(proc, port, data_dir, log_path)

    def up_or_gone() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    wait_for(up_or_gone, 30, "quiet proxy")
    assert proc.poll() is None, q.log()
    return q
