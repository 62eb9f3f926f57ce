"""A proxy started the way a user starts it: ``politeproxy run`` without -v (its start-up lines are the
ones a user sees)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tests.support.processes import POLITEPROXY, ROOT, free_port, stop_process, wait_for
from tests.support.proxy_proc import answers_as
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
    data_dir = tmp / "data"
    # As start_proxy: a port free_port() handed out may be bound first by another test's proxy, which then
    # answers /healthz; only this proxy's own answer (its CA) counts, and a port lost that way is tried again.
    for attempt in range(3):
        q = _launch(cfg, data_dir, tmp / f"quiet-{attempt}.log", free_port(), args, env)
        wait_for(partial(_up_or_gone, q), 30, "quiet proxy")
        if q.proc.poll() is None or "in use" not in q.log().lower():
            break
    assert q.proc.poll() is None, q.log()
    return q


def _launch(
    cfg: Path, data_dir: Path, log_path: Path, port: int, args: tuple[str, ...], env: dict[str, str] | None
) -> Quiet:
    cmd = [*POLITEPROXY, "run", "--config", str(cfg), "--data-dir", str(data_dir)]
    cmd += ["--listen", f"127.0.0.1:{port}", *args]
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return Quiet(proc, port, data_dir, log_path)


def _up_or_gone(q: Quiet) -> bool:
    """Exited, or answering as itself (proxy_proc.answers_as: its own CA at /ca.pem)."""
    return q.proc.poll() is not None or answers_as(q.port, q.data_dir)
