"""`politeproxy exec -- COMMAND` (issue 45 item 1): COMMAND runs in a network namespace whose only way out is
the proxy. Clients that follow the env lines (curl, requests, duckdb 1.5, pyarrow's S3FileSystem given
proxy_options) work unchanged through it, counted at the fake upstream; a client that ignores them (pyarrow
without proxy_options, a socket to an address) fails at once, and exec names what it tried. Exit status and
signals pass through. Runs as root (CI is root); the normal-user case runs as `nobody` where the kernel lets
a normal user make a user namespace.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import POLITEPROXY, PY, ROOT, wait_for
from tests.support.proxy_proc import FAST, ProxyProc, start_proxy
from tests.support.proxyio import arrivals
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

if (
    os.geteuid() != 0
    or not shutil.which("unshare")
    or not shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin")
):
    pytest.skip(
        "politeproxy exec's tests run as root with unshare and ip (iproute2)", allow_module_level=True
    )

NOTHING = "nothing went around the proxy"
TEXT = b"through the only door\n"
ROWS = 100
DUCKDB15 = Path(sys.prefix) / "duckdb15"


@pytest.fixture(scope="module")
def served(certs: Certs) -> Iterator[tuple[ProxyProc, Upstream]]:
    # Not under pytest's own temp dir (mode 0700): the normal-user case reads the CA from the data dir.
    tmp = Path(tempfile.mkdtemp(prefix="pp-exec-"))
    tmp.chmod(0o755)
    files = tmp / "files"
    files.mkdir()
    (files / "door.txt").write_bytes(TEXT)
    pq.write_table(pa.table({"n": list(range(ROWS))}), files / "t.parquet")
    up = start_upstream(certs, tmp, files_dir=files)
    p = start_proxy(tmp, up, certs, FAST, data_dir=tmp / "data")
    (tmp / "data").chmod(0o755)
    yield p, up
    p.stop()
    up.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def exec_argv(p: ProxyProc, *command: str) -> list[str]:
    return [
        *POLITEPROXY,
        "exec",
        "--data-dir",
        str(p.data_dir),
        "--listen",
        f"127.0.0.1:{p.port}",
        "--",
        *command,
    ]


def run_exec(p: ProxyProc, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """exec in a process whose environment has no proxy variables: exec sets them."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PYTHON")})
    return subprocess.run(
        exec_argv(p, *command), capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def py(code: str) -> tuple[str, ...]:
    return (PY, "-c", code)


def test_curl_works_unchanged(served: tuple[ProxyProc, Upstream]) -> None:
    p, up = served
    r = run_exec(p, "curl", "-sS", "-f", "https://data.commoncrawl.org/files/door.txt?curl")
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == TEXT
    assert NOTHING in r.stderr
    assert [a["path"] for a in arrivals(up, "/files/door.txt?curl")]  # it reached the upstream, via the proxy
    assert "Traceback" not in r.stderr and "Task was destroyed" not in r.stderr, r.stderr  # a clean end


def test_requests_works_unchanged(served: tuple[ProxyProc, Upstream]) -> None:
    p, up = served
    code = "import requests; print(requests.get('https://data.commoncrawl.org/files/door.txt?requests').text)"
    r = run_exec(p, *py(code))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == TEXT.decode().strip()
    assert NOTHING in r.stderr
    assert arrivals(up, "/files/door.txt?requests")


@pytest.mark.skipif(
    not any(DUCKDB15.glob("duckdb_extension_httpfs/extensions/v1.5.*/httpfs.duckdb_extension")),
    reason="duckdb 1.5 is not installed beside the venv (make test installs it)",
)
def test_duckdb_works_unchanged(served: tuple[ProxyProc, Upstream]) -> None:
    """duckdb 1.5 as docs/tools.md sets it up: the proxy from HTTPS_PROXY, the bundle named in SQL."""
    p, up = served
    httpfs = next(DUCKDB15.glob("duckdb_extension_httpfs/extensions/v1.5.*/httpfs.duckdb_extension"))
    code = f"""
import os, duckdb
con = duckdb.connect(config={{"autoinstall_known_extensions": False, "autoload_known_extensions": False}})
con.execute("LOAD '{httpfs}'")
con.execute("SET ca_cert_file = '" + os.environ["SSL_CERT_FILE"] + "'")
con.execute("SET enable_progress_bar = false")  # past 2 s (a loaded box) duckdb draws one on stdout
print(con.execute("SELECT count(*) FROM read_parquet('https://data.commoncrawl.org/cc-index/table/t.parquet')").fetchone()[0])
"""
    env_path = {"PYTHONPATH": str(DUCKDB15)}
    r = run_exec(p, "env", *(f"{k}={v}" for k, v in env_path.items()), *py(code))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(ROWS)]
    assert NOTHING in r.stderr
    assert arrivals(up, "/cc-index/table/t.parquet")


S3_READ = """
import os, sys, time
from urllib.parse import urlsplit
import pyarrow.fs as fs, pyarrow.parquet as pq
kw = {}
if sys.argv[1] == "proxy_options":
    u = urlsplit(os.environ["HTTPS_PROXY"])
    kw["proxy_options"] = {"scheme": u.scheme, "host": u.hostname, "port": u.port}
s3 = fs.S3FileSystem(anonymous=True, region="us-east-1", tls_ca_file_path=os.environ["SSL_CERT_FILE"],
                     connect_timeout=20, request_timeout=20, **kw)
t0 = time.monotonic()
try:
    print(pq.read_table("commoncrawl/cc-index/table/t.parquet", filesystem=s3).num_rows)
except OSError as e:
    print(f"failed after {time.monotonic() - t0:.1f}s: {e}")
    sys.exit(1)
"""


def test_pyarrow_s3_without_proxy_options_fails_at_once_and_is_named(
    served: tuple[ProxyProc, Upstream],
) -> None:
    """pyarrow's S3FileSystem ignores HTTPS_PROXY: under exec its lookup of the bucket's name is refused at
    once (not a connect timeout: 20 s here), and exec names the name."""
    p, up = served
    r = run_exec(p, *py(S3_READ), "none")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout.startswith("failed after"), r.stdout
    # Refused, not timed out: the AWS SDK's own retries (3 attempts, short backoff) are all it waits.
    assert float(r.stdout.split()[2].rstrip("s:")) < 15, r.stdout
    assert "tried to go around the proxy" in r.stderr
    assert "commoncrawl.s3" in r.stderr.split("names it tried to resolve")[1], r.stderr


def test_pyarrow_s3_with_proxy_options_reads_through_the_proxy(served: tuple[ProxyProc, Upstream]) -> None:
    p, up = served
    before = len(arrivals(up, "/cc-index/table/t.parquet"))
    r = run_exec(p, *py(S3_READ), "proxy_options")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.split() == [str(ROWS)]
    assert NOTHING in r.stderr
    hosts = {a["host"] for a in arrivals(up, "/cc-index/table/t.parquet")[before:]}
    assert hosts and all(h.startswith("commoncrawl.s3") for h in hosts), hosts


def test_a_connection_to_an_address_is_refused_and_named(served: tuple[ProxyProc, Upstream]) -> None:
    """An address given directly (no lookup) is refused by the namespace's kernel at once: 192.0.2.7 is
    TEST-NET-1, and every address is local to the namespace's loopback, so nothing leaves the machine."""
    p, _ = served
    code = """
import socket
for family, addr in ((socket.AF_INET, ("192.0.2.7", 8443)), (socket.AF_INET6, ("2001:db8::7", 443))):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(20)
    try:
        s.connect(addr)
    except ConnectionRefusedError:
        print("refused")
"""
    r = run_exec(p, *py(code))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "refused"]
    report = r.stderr.split("addresses it tried to reach")[1]
    assert "192.0.2.7:8443/tcp" in report and "[2001:db8::7]:443/tcp" in report, r.stderr


def test_a_resolver_of_its_own_is_refused_and_named(served: tuple[ProxyProc, Upstream]) -> None:
    """A DNS query sent to a name server of its own choosing (written in, not resolv.conf's) gets REFUSED
    from the namespace's stub resolver, which names what was asked."""
    p, _ = served
    code = """
import socket, dns.message, dns.query, dns.rcode
q = dns.message.make_query("index.commoncrawl.org", "A")
print(dns.rcode.to_text(dns.query.udp(q, "198.51.100.53", timeout=10).rcode()))
"""
    r = run_exec(p, *py(code))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "REFUSED"
    assert "index.commoncrawl.org" in r.stderr.split("names it tried to resolve")[1]


def test_exit_status_passes_through(served: tuple[ProxyProc, Upstream]) -> None:
    p, _ = served
    assert run_exec(p, "sh", "-c", "exit 7").returncode == 7
    assert run_exec(p, "no-such-command-45").returncode == 127
    killed = run_exec(p, *py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"))
    assert killed.returncode == -signal.SIGTERM  # exec ends by the same signal, as the shell would see


def test_signals_pass_through(served: tuple[ProxyProc, Upstream], tmp_path: Path) -> None:
    """A signal sent to exec alone reaches COMMAND: USR1 is caught and answered, TERM ends it."""
    p, _ = served
    ready = tmp_path / "ready"
    code = f"""
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *a: print("usr1", flush=True))
pathlib.Path({str(ready)!r}).write_text("ok")
time.sleep(60)
"""
    proc = subprocess.Popen(
        exec_argv(p, *py(code)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        wait_for(ready.exists, timeout=30, what="COMMAND started")
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)  # the handler prints before TERM ends it: order, not speed
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.split() == ["usr1"], err
    assert proc.returncode == -signal.SIGTERM


NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups")


def _nobody_python(setpriv: str) -> tuple[list[str], dict[str, str]] | None:
    """An interpreter `nobody` can start inside a user namespace: this one, or (where this one lives under a
    directory only root may enter, as on this project's machines) the system's of the same version with
    this checkout's packages on PYTHONPATH. None: neither."""
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"), None)
    system = Path("/usr/bin/python3")
    choices = [([PY], {})]
    if site is not None and system.exists():
        choices.append(([str(system)], {"PYTHONPATH": f"{ROOT}:{site}"}))
    for argv, env in choices:
        probe = [setpriv, *NOBODY, "unshare", "-r", "-n", "--mount", *argv, "-c", "import politeproxy, dns"]
        done = subprocess.run(
            probe, capture_output=True, timeout=30, check=False, cwd="/", env={**env, "PATH": "/usr/bin:/bin"}
        )
        if done.returncode == 0:
            return argv, env
    return None


def test_as_a_normal_user(served: tuple[ProxyProc, Upstream]) -> None:
    """As `nobody`: a user namespace where the kernel allows one (curl works, as for root); where it does not,
    exec says so and what to do, with exit 125."""
    p, up = served
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    userns = subprocess.run(
        [setpriv, *NOBODY, "unshare", "-r", "-n", "true"], capture_output=True, timeout=30
    )
    python = _nobody_python(setpriv) if userns.returncode == 0 else ([PY], {})
    if python is None:
        pytest.skip("no interpreter with this checkout's packages that nobody may run in a user namespace")
    # The user's own data dir, as when a user runs a proxy of their own (env reads the CA's key); the root
    # proxy that serves this module keeps working from it.
    for path in (p.data_dir, *p.data_dir.rglob("*")):
        os.chown(path, 65534, 65534)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", **python[1]}
    argv = [
        setpriv,
        *NOBODY,
        *python[0],
        *exec_argv(p, "curl", "-sS", "-f", "https://data.commoncrawl.org/files/door.txt?nobody")[1:],
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/", env=env)
    if userns.returncode:
        assert r.returncode == 125 and "user namespace" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == TEXT
    assert NOTHING in r.stderr
    assert arrivals(up, "/files/door.txt?nobody")


def test_ctrl_c_in_a_terminal_reaches_the_command_once(
    served: tuple[ProxyProc, Upstream], tmp_path: Path
) -> None:
    """Ctrl-C in a terminal goes to the whole foreground process group, COMMAND included: exec (both halves)
    takes it without sending it again (si_code SI_KERNEL), so COMMAND counts one SIGINT, not three."""
    p, _ = served
    ready = tmp_path / "ready"
    code = f"""
import pathlib, signal, time
count = []
signal.signal(signal.SIGINT, lambda *a: count.append(1))
pathlib.Path({str(ready)!r}).write_text("ok")
deadline = time.monotonic() + 20
while not count and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)  # time for a second or third copy to arrive, were one sent
print("sigint", len(count), flush=True)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the pty as its terminal, exec in the foreground
        try:
            os.chdir(ROOT)
            os.execve(PY, exec_argv(p, *py(code)), env)
        finally:
            os._exit(127)
    out = b""
    try:
        wait_for(ready.exists, timeout=30, what="COMMAND started")
        os.write(fd, b"\x03")  # the terminal's interrupt character: SIGINT to the foreground group
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready_fds, _, _ = select.select([fd], [], [], 1)
            if ready_fds:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child side closed
                    break
                if not chunk:
                    break
                out += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.close(fd)
    assert b"sigint 1" in out, out
    assert os.waitstatus_to_exitcode(status) == 0, out


def test_clients_that_ignore_the_settings_are_named(served: tuple[ProxyProc, Upstream]) -> None:
    """The bypasses of docs/tools.md's recipes, caught: httpx with trust_env=False, and Node's fetch without
    undici's EnvHttpProxyAgent (Node 20 ignores HTTPS_PROXY), fail under exec and are named."""
    p, up = served
    url = "https://data.commoncrawl.org/files/door.txt?bypass"
    code = f"import httpx\ntry:\n    httpx.get({url!r}, trust_env=False)\n"
    code += "except httpx.HTTPError:\n    print('refused')"
    r = run_exec(p, *py(code))
    assert r.returncode == 0 and r.stdout.strip() == "refused", (r.stdout, r.stderr)
    assert "data.commoncrawl.org" in r.stderr.split("names it tried to resolve")[1]
    if shutil.which("node"):
        script = f"fetch({url!r}).then(() => console.log('through'), () => console.log('refused'))"
        r = run_exec(p, "node", "-e", script)
        assert r.stdout.strip() == "refused", (r.stdout, r.stderr)
        assert "data.commoncrawl.org" in r.stderr.split("names it tried to resolve")[1]
    assert not arrivals(up, "/files/door.txt?bypass")


def test_a_connection_still_open_when_command_ends_ends_quietly(served: tuple[ProxyProc, Upstream]) -> None:
    """COMMAND leaves a process behind that holds a connection through the relay: exec stops with the relay
    still open, and closes it without a traceback (Python 3.11's stream server logs one for a cancelled
    handler)."""
    p, _ = served
    holder = f"import socket, time; s = socket.create_connection(('127.0.0.1', {p.port})); time.sleep(3)"
    script = f'{shlex.quote(PY)} -c "{holder}" >/dev/null 2>&1 & sleep 1'
    r = run_exec(p, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Task was destroyed" not in r.stderr, r.stderr
    assert NOTHING in r.stderr
