"""`politeproxy exec -- COMMAND...`: COMMAND with the env lines set, in a network namespace whose only way
out is the proxy (issue 45). A client that ignores the proxy settings fails at once, and what it tried is
printed when COMMAND ends.

This half stays in the machine's namespace: it serves a Unix socket that it relays to the proxy's TCP
port, and starts the other half (exec_ns.py) through ``unshare``: as root, a network and a mount namespace;
as another user, a user namespace too (``--map-root-user``), where the kernel allows it. A Unix socket
bound to a path is reached by path from any network namespace: that is the one door.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from politeproxy.commands.exec_child import exit_like, spawn, wait_forwarding
from politeproxy.commands.exec_records import KeyCounts, report_lines
from politeproxy.commands.exec_relay import Relay, stop_loop, to_tcp

EXIT_SETUP = 125  # exec itself could not run COMMAND as asked (as env(1), timeout(1) and docker run do)
PROBE_TIMEOUT = 10.0
REPORT = "report.json"  # written by exec_ns.py


class CannotIsolate(Exception):
    pass


def env_values(lines: Sequence[str]) -> dict[str, str]:
    """The variables of `politeproxy env`'s export lines (shell-quoted values read back with shlex)."""
    values: dict[str, str] = {}
    for line in lines:
        if line.startswith("export "):
            words = shlex.split(line[len("export ") :])
            if words and "=" in words[0]:
                key, value = words[0].split("=", 1)
                values[key] = value
    return values


def unshare_argv() -> list[str]:
    """``unshare`` with the namespaces this user may make, or CannotIsolate saying why not and what to do."""
    tool = shutil.which("unshare") or shutil.which("unshare", path="/usr/bin:/bin")
    if tool is None:
        raise CannotIsolate("`unshare` not found (util-linux)")
    argv = [tool, "--net", "--mount"]
    if os.geteuid() == 0:
        return argv
    argv.insert(1, "--map-root-user")
    try:
        probe = subprocess.run(
            [*argv, "true"], capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CannotIsolate(f"unshare: {e}") from None
    if probe.returncode:
        raise CannotIsolate(
            "not root, and this kernel does not let a normal user make a network namespace "
            f"({probe.stderr.strip()[:200] or 'unshare failed'}): run exec as root, or allow unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, "
            "or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    return argv


class Door:
    """The Unix socket served on an event loop in a thread, each connection relayed to the proxy."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(512)
        self.sock.setblocking(False)
        self.relay = Relay(to_tcp(host, port))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="exec-door", daemon=True)

    def start(self) -> None:
        self.thread.start()

        async def serve() -> None:
            self.server = await asyncio.start_unix_server(self.relay.handle, sock=self.sock)

        asyncio.run_coroutine_threadsafe(serve(), self.loop).result(PROBE_TIMEOUT)

    def stop(self) -> None:
        stop_loop(self.loop, self.thread, PROBE_TIMEOUT)


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host.strip("[]"), port), timeout=PROBE_TIMEOUT / 5).close()
    except OSError:
        return False
    return True


def _read_report(workdir: Path) -> dict[str, object] | None:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((workdir / REPORT).read_text(encoding="utf-8"))
        if isinstance(doc, dict):
            return doc
    return None


def run(netloc: str, lines: Sequence[str], command: Sequence[str]) -> int:
    """Run ``command`` through the proxy at ``netloc`` (HOST:PORT) with ``lines``' variables."""
    if not command:
        print("politeproxy exec: no COMMAND (politeproxy exec [flags] -- COMMAND ...)", file=sys.stderr)
        return EXIT_SETUP
    try:
        unshare = unshare_argv()
    except CannotIsolate as e:
        print(f"politeproxy exec: cannot isolate COMMAND: {e}", file=sys.stderr)
        return EXIT_SETUP
    host, _, port = netloc.rpartition(":")
    if not _answers(host, int(port)):
        print(
            f"politeproxy exec: warning: no proxy answers at {netloc} (start it with `politeproxy run`); "
            "COMMAND's requests through it will fail",
            file=sys.stderr,
        )
    workdir = Path(tempfile.mkdtemp(prefix="politeproxy-exec-"))
    try:
        try:  # a Unix socket path past 107 bytes (a long TMPDIR), an unshare that cannot be run
            door = Door(workdir / "proxy.sock", host, int(port))
            inner = [
                sys.executable,
                "-m",
                "politeproxy.commands.exec_ns",
                "--relay",
                str(workdir / "proxy.sock"),
            ]
            inner += ["--listen", netloc, "--workdir", str(workdir), "--", *command]
            env = {**os.environ, **env_values(lines), "POLITEPROXY_EXEC": "1"}
            proc = spawn([*unshare, *inner], env)
        except OSError as e:
            print(f"politeproxy exec: cannot start: {e}", file=sys.stderr)
            return EXIT_SETUP
        door.start()
        rc = wait_forwarding(proc)
        door.stop()
        report = _read_report(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if report is None:  # the inner half failed before COMMAND ran, and said why
        return exit_like(rc)
    relayed = report.get("relayed")
    lines_out = report_lines(
        KeyCounts.from_json(report.get("names")),
        KeyCounts.from_json(report.get("addresses")),
        relayed if isinstance(relayed, int) else 0,
    )
    if door.relay.failed:
        lines_out.append(f"politeproxy exec: {door.relay.failed} connection(s) found no proxy at {netloc}")
    print("\n".join(lines_out), file=sys.stderr, flush=True)
    code = report.get("returncode")
    return exit_like(code if isinstance(code, int) and not isinstance(code, bool) else rc)
