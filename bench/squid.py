"""Squid with ssl-bump as a relay beside politeproxy: its own CA, one worker, caching off, access log on.

``start_squid(bench, up)`` writes a squid.conf into a directory of the bench's temp dir, makes a CA there
(trustme, as the tests' certificates are made), initialises security_file_certgen's database for the
certificates Squid mimics, and runs ``squid -N`` (no daemon, no SMP master: one process whose CPU /proc
shows) on a free port of 127.0.0.1. Every request goes to the fake upstream as an origin-server peer over
TLS, verified against the upstream's CA; ``hosts_file`` names Common Crawl's hosts, so Squid asks no DNS.
The bench's exit stack stops it (SIGTERM; ``shutdown_lifetime`` 1 s).

Squid comes from Debian's ``squid-openssl`` (5.7 on bookworm): ``make bench-squid`` installs it with
apt-get when no Squid with ssl-crtd is on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA_HOST, Bench, Proxy, Upstream, port_open  # noqa: E402
from tests.support.processes import free_port, wait_for  # noqa: E402
from tests.support.upstream_proc import CC_HOSTS  # noqa: E402

CERTGEN_DIRS = ("/usr/lib/squid", "/usr/lib64/squid", "/usr/libexec/squid")
INSTALL_HINT = "no Squid with ssl-bump here: `make bench-squid-setup` (apt-get install squid-openssl)"

CONF = """\
# bench/squid.py: one worker, ssl-bump of every CONNECT, no cache, an access log like politeproxy's.
workers 1
http_port 127.0.0.1:{port} ssl-bump tls-cert={d}/ca.pem tls-key={d}/ca.key \
generate-host-certificates=on dynamic_cert_mem_cache_size=4MB
sslcrtd_program {certgen} -s {d}/ssl_db -M 4MB
sslcrtd_children 2 startup=1 idle=1
# Bumped at the first step (client-first: the leaf is made for the CONNECT's host). Peeking first made
# Squid 5.7 answer hey's (Go's) requests with ERR_SECURE_CONNECT_FAIL; curl's went through either way.
ssl_bump bump all

# Straight to the stand-in upstream, verified against its CA; the hosts file maps Common Crawl's
# names to 127.0.0.1 (clients name the upstream's port: see start_squid).
tls_outgoing_options cafile={up_ca}
hosts_file {d}/hosts

http_access allow localhost
http_access deny all
cache deny all

access_log stdio:{d}/access.log
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
visible_hostname politeproxy-bench-squid
max_filedescriptors {fds}
# The bench's end stops it at once (the default waits 30 s for clients).
shutdown_lifetime 1 seconds
# Nothing beside the relay: no ICMP pinger, no cache digest, no netdb file, no ICP port.
pinger_enable off
digest_generation off
netdb_filename none
icp_port 0
"""


def squid_path() -> str | None:
    """The squid binary when it was built with ssl-crtd (Debian's squid-openssl), else None."""
    exe = shutil.which("squid") or next(
        (p for p in ("/usr/sbin/squid", "/usr/local/sbin/squid") if Path(p).exists()), None
    )
    if exe is None:
        return None
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=30).stdout
    return exe if "--enable-ssl-crtd" in out else None


def squid_version(exe: str) -> str:
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0].replace("Squid Cache: Version ", "") if out else "?"


def _certgen() -> str:
    for d in CERTGEN_DIRS:
        if (Path(d) / "security_file_certgen").exists():
            return str(Path(d) / "security_file_certgen")
    raise RuntimeError("security_file_certgen not found (squid-openssl installs it in /usr/lib/squid)")


def _as_squid_user(d: Path) -> None:
    """Run as root, Squid drops to its effective user (Debian's ``proxy``): hand it its directory."""
    if os.geteuid() != 0:
        return
    for p in [d, *d.rglob("*")]:
        shutil.chown(p, "proxy", "proxy")


def start_squid(
    bench: Bench, up: Upstream, fds: int = 4096, wrap: Sequence[str] = (), ready_within: float = 60
) -> Proxy:
    """Squid relaying to ``up`` with ssl-bump, on a free port; the returned Proxy trusts Squid's CA.
    ``wrap``: a command Squid runs under (bench/instructions.py: valgrind)."""
    exe = squid_path()
    if exe is None:
        raise RuntimeError(INSTALL_HINT)
    port = free_port()
    d = bench.tmp / f"squid-{port}"
    d.mkdir()
    if os.geteuid() == 0:  # Squid's user passes through the bench's temp dir (0700 from mkdtemp)
        bench.tmp.chmod(0o711)
    shutil.copy(up.ca_file, d / "upstream-ca.pem")
    ca = trustme.CA(organization_name="politeproxy bench squid")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    ca.private_key_pem.write_to_path(str(d / "ca.key"))
    (d / "hosts").write_text("127.0.0.1 localhost " + " ".join(CC_HOSTS) + "\n")
    certgen = _certgen()
    subprocess.run([certgen, "-c", "-s", str(d / "ssl_db"), "-M", "4MB"], check=True, capture_output=True)
    conf = d / "squid.conf"
    conf.write_text(CONF.format(port=port, d=d, certgen=certgen, up_ca=d / "upstream-ca.pem", fds=fds))
    _as_squid_user(d)
    subprocess.run([exe, "-k", "parse", "-f", str(conf)], check=True, capture_output=True, timeout=60)
    proc = bench.spawn([*wrap, exe, "-N", "-f", str(conf)], f"squid-{port}.log")
    wait_for(lambda: proc.poll() is not None or port_open(port), ready_within, "squid")
    if proc.poll() is not None:
        log = (d / "cache.log").read_text(errors="replace") if (d / "cache.log").exists() else ""
        raise RuntimeError(f"squid exited: {log[-3000:]}")
    # Squid goes straight to the host a client names, on the port it names: the stand-in upstream's (a
    # cache_peer would open an upstream connection per bumped request; Squid has no port map).
    return Proxy("squid", proc, port, d / "ca.pem", d, host=f"{DATA_HOST}:{up.port}")
