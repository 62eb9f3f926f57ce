"""The half of `politeproxy exec` inside the new network namespace (started by exec_cmd.py through
``unshare``, as root of that namespace): make the loopback the only network, every address local to it,
so a connection to anything but the relay is refused at once; resolv.conf pointing at the stub resolver
and an /etc/hosts of loopback's names only;
then run COMMAND and write what it tried (the report) where the outer half reads it.

    python -m politeproxy.commands.exec_ns --relay SOCK --listen HOST:PORT --workdir DIR -- COMMAND...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from politeproxy.commands.exec_child import exit_like, spawn, wait_forwarding
from politeproxy.commands.exec_records import KeyCounts
from politeproxy.commands.exec_relay import (
    Relay,
    Watch,
    listening,
    resolver_sockets,
    stop_loop,
    stub_resolver,
    to_unix,
)

SETUP_TIMEOUT = 10.0  # each ip/mount call: instant, unless something is badly wrong
REPORT = "report.json"
RESOLV = "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"  # REFUSED: the resolver gives up at once


class SetupError(Exception):
    pass


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise SetupError(f"`{name}` not found (Debian: apt-get install iproute2 mount)")
    return found


def _run(*argv: str, optional: bool = False) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SETUP_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"{' '.join(argv)}: {e}") from None
    if done.returncode and not optional:
        raise SetupError(f"{' '.join(argv)}: {done.stderr.strip()[:300]}")


def network(workdir: Path) -> None:
    """The loopback up, every IPv4 and IPv6 address routed to it as local (nothing else exists here, so
    nothing leaves), and the stub resolver as the only name server (files, then DNS: no resolver service
    reached over a Unix socket, such as systemd-resolved's, answers for the namespace)."""
    ip, mount = _tool("ip"), _tool("mount")
    _run(ip, "link", "set", "lo", "up")
    _run(ip, "route", "add", "local", "0.0.0.0/0", "dev", "lo")
    _run(ip, "-6", "route", "add", "local", "::/0", "dev", "lo", optional=True)  # IPv6 may be off
    resolv = workdir / "resolv.conf"
    resolv.write_text(RESOLV, encoding="utf-8")
    _bind(mount, resolv, Path("/etc/resolv.conf"))
    # Only loopback's names and this machine's: a name the machine's /etc/hosts maps (a local stand-in for
    # Common Crawl, say) is asked of the stub resolver, so the report names it too.
    hosts = workdir / "hosts"
    name = socket.gethostname()
    hosts.write_text(f"127.0.0.1 localhost {name}\n::1 localhost ip6-loopback\n", encoding="utf-8")
    _bind(mount, hosts, Path("/etc/hosts"))
    nss = Path("/etc/nsswitch.conf")
    with contextlib.suppress(OSError, UnicodeError):
        text = nss.read_text(encoding="utf-8")
        mine = workdir / "nsswitch.conf"
        lines = [
            ("hosts: files dns" if ln.split(":")[0].strip() == "hosts" else ln) for ln in text.splitlines()
        ]
        mine.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _bind(mount, mine, nss)


def _bind(mount: str, src: Path, dst: Path) -> None:
    if dst.is_symlink() or dst.exists():
        _run(mount, "--bind", str(src), str(dst.resolve()))
    # no file at all: glibc's default name server is 127.0.0.1 already, the stub resolver


class Inside:
    """The namespace's servers, on an event loop in a thread of their own (the main thread waits for
    COMMAND and passes signals on)."""

    def __init__(self, relay_sock: Path, host: str, port: int) -> None:
        self.names, self.addresses = KeyCounts(), KeyCounts()
        self.relay = Relay(to_unix(relay_sock))
        self.listen = listening(host, port)
        self.dns = resolver_sockets()
        netloc = f"[{host.strip('[]')}]" if ":" in host else host
        self.watch = Watch(self.addresses, f"{netloc}:{port}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="exec-ns", daemon=True)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(SETUP_TIMEOUT)

    async def _serve(self) -> None:
        self.held: list[asyncio.BaseTransport | asyncio.Server] = [
            await asyncio.start_server(self.relay.handle, sock=self.listen)
        ]
        self.held += await stub_resolver(self.names, self.dns)
        self.watch.start()

    def finish(self) -> dict[str, object]:
        async def stop() -> None:
            self.watch.drain()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(SETUP_TIMEOUT)
        stop_loop(self.loop, self.thread, SETUP_TIMEOUT)
        return {
            "names": self.names.to_json(),
            "addresses": self.addresses.to_json(),
            "relayed": self.relay.count,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="politeproxy-exec-ns")
    p.add_argument("--relay", required=True, type=Path)
    p.add_argument("--listen", required=True)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    host, _, port = args.listen.rpartition(":")
    report: dict[str, object] = {}
    try:
        network(args.workdir)
        inside = Inside(args.relay, host, int(port))
    except (SetupError, OSError) as e:
        print(f"politeproxy exec: cannot set up the namespace: {e}", file=sys.stderr)
        return 125
    try:
        proc = spawn(command)
    except FileNotFoundError:
        print(f"politeproxy exec: {command[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as e:
        print(f"politeproxy exec: {command[0]}: {e.strerror}", file=sys.stderr)
        return 126
    inside.start()
    rc = wait_forwarding(proc)
    report = {**inside.finish(), "returncode": rc}
    (args.workdir / REPORT).write_text(json.dumps(report), encoding="utf-8")
    return exit_like(rc)


if __name__ == "__main__":
    sys.exit(main())
