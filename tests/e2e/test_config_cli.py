"""The config file and the command line: validation, exit codes, `env`, `ca`, environment variables."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from politeproxy.config.loading import ConfigError, load
from tests.support.processes import POLITEPROXY, ROOT, free_port, need_tool, wait_for
from tests.support.proxy_proc import FAST
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import Certs, Upstream

ENV_KEYS = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment without POLITEPROXY_*, with a private XDG_DATA_HOME (the default data dir)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLITEPROXY_")}
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    env.update(extra)
    return env


def cli(tmp: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*POLITEPROXY, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(tmp, **env),
    )


# Three mistakes as real processes (an unknown key, a bad duration, not TOML): the interpreter's exit status
# and its one line on stderr, each started three times (run, check-config, run with POLITEPROXY_CONFIG).
# Every other kind of mistake is checked the same way in this process, through the same entry point
# (tests/unit/commands/test_config_errors.py): here they were 36 interpreter starts more, ~40 s of a worker
# (until 2026-12-07).
BAD = [
    ("[upstream]\nbogus = 1\n", "upstream.bogus", "unknown key"),
    ("[client]\nidle_timeout = true\n", "client.idle_timeout", "duration"),
    ("this is = not toml [\n", "not valid TOML", ""),
]


@pytest.mark.parametrize(("text", "key", "what"), BAD)
def test_invalid_config_refuses_to_start(tmp_path: Path, text: str, key: str, what: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    r = cli(tmp_path, "run", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert key in lines[0] and what in lines[0], lines[0]
    assert str(cfg) in lines[0]
    # check-config says the same, with the same exit code.
    c = cli(tmp_path, "check-config", str(cfg))
    assert c.returncode == 2 and c.stderr.strip() == lines[0]
    # And POLITEPROXY_CONFIG is read the same way.
    e = cli(tmp_path, "run", "--listen", f"127.0.0.1:{free_port()}", POLITEPROXY_CONFIG=str(cfg))
    assert e.returncode == 2 and e.stderr.strip() == lines[0]


@pytest.mark.parametrize(
    ("users", "key"),
    [
        ("{ alice = 81726354 }", "auth.users.alice"),
        ("{ alice = ['s3cret-81726354'] }", "auth.users.alice"),
        ("{ alice = { pw = 's3cret-81726354' } }", "auth.users.alice"),
        ("'alice:s3cret-81726354'", "auth.users"),
        ("['alice:s3cret-81726354']", "auth.users"),
    ],
)
def test_a_password_that_is_no_string_is_never_echoed(tmp_path: Path, users: str, key: str) -> None:
    """Issue 25 item 11: a password of the wrong type (a number, a list, the env form in the file) is
    refused with the key and the type, and its value appears nowhere in the error line."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f"[auth]\nusers = {users}\n")
    for args in (("check-config", str(cfg)), ("run", "--config", str(cfg), "--listen", "127.0.0.1:0")):
        r = cli(tmp_path, *args)
        assert r.returncode == 2, r.stderr
        assert key in r.stderr and "(not shown)" in r.stderr, r.stderr
        assert "81726354" not in r.stderr, r.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    r = cli(tmp_path, "run", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"politeproxy: error: {tmp_path / 'nope.toml'}: no such file"]


def test_bad_flags_exit_2(tmp_path: Path) -> None:
    r = cli(tmp_path, "run", "--listen", "nowhere")
    assert r.returncode == 2 and "listen" in r.stderr
    r = cli(tmp_path, "run", "--global-rate", "fast")
    assert r.returncode == 2 and "global_rate" in r.stderr
    r = cli(tmp_path, "run", "--listen", "nowhere", POLITEPROXY_LISTEN="127.0.0.1:1")
    assert r.returncode == 2  # the flag wins over the environment, and is checked
    r = cli(tmp_path, "run", POLITEPROXY_LISTEN="nowhere")
    assert r.returncode == 2 and "listen" in r.stderr


def test_listen_address_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli(tmp_path, "run", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr


def test_check_config_ok(tmp_path: Path) -> None:
    cfg = tmp_path / "good.toml"
    cfg.write_text(
        'listen = "127.0.0.1:4000"\npaced_hosts = ["commoncrawl.org", "*.commoncrawl.org"]\n'
        '[upstream]\nconnect_timeout = "2s"\nread_timeout = "30s"\n[upstream.resolve]\n'
        '"data.commoncrawl.org:443" = "127.0.0.1:8443"\n[client]\nidle_timeout = "1m30s"\n'
        '[auth]\nusers = { alice = "pw" }\n'
    )
    r = cli(tmp_path, "check-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and "127.0.0.1:4000" in r.stdout
    c = load(cfg)
    assert c.listen == ("127.0.0.1", 4000)
    assert c["upstream"]["connect_timeout"] == 2.0 and c["upstream"]["read_timeout"] == 30.0
    assert c["client"]["idle_timeout"] == 90.0
    assert c["upstream"]["resolve"] == {"data.commoncrawl.org:443": "127.0.0.1:8443"}


def test_config_errors_name_the_key_in_process(tmp_path: Path) -> None:
    for text, key, what in BAD:
        cfg = tmp_path / "c.toml"
        cfg.write_text(text)
        with pytest.raises(ConfigError) as e:
            load(cfg)
        assert key in str(e.value) and what in str(e.value)


def test_env_prints_every_export_line(tmp_path: Path) -> None:
    from politeproxy.commands.envlines import NO_PROXY

    d = tmp_path / "d"
    r = cli(tmp_path, "env", "--data-dir", str(d), "--listen", "127.0.0.1:4567")
    assert r.returncode == 0, r.stderr
    exports = dict(
        line[len("export ") :].split("=", 1) for line in r.stdout.splitlines() if line.startswith("export ")
    )
    for key in ENV_KEYS:
        assert key in exports, (key, r.stdout)
    # Every export line, its value written out here (not read back from the output): a wrong, missing or
    # extra line fails.
    proxy, bundle = "http://127.0.0.1:4567", str(d / "trust-bundle.pem")  # system roots + certifi + CA
    expected = {
        "HTTPS_PROXY": proxy,
        "HTTP_PROXY": proxy,
        "https_proxy": proxy,
        "http_proxy": proxy,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
        "SSL_CERT_FILE": bundle,
        "REQUESTS_CA_BUNDLE": bundle,
        "CURL_CA_BUNDLE": bundle,
        "AWS_CA_BUNDLE": bundle,
        "NODE_EXTRA_CA_CERTS": str(d / "ca.pem"),
        # the JVM (issue 26): the proxy, and the truststore env wrote beside the bundle (one quoted value)
        "JAVA_TOOL_OPTIONS": (
            " ".join(
                [
                    "-Dhttps.proxyHost=127.0.0.1",
                    "-Dhttps.proxyPort=4567",
                    "-Dhttp.proxyHost=127.0.0.1",
                    "-Dhttp.proxyPort=4567",
                    "-Dhttp.nonProxyHosts="
                    + "|".join(f"[{h}]" if ":" in h else h for h in NO_PROXY.split(",")),
                    f"-Djavax.net.ssl.trustStore={d / 'java-truststore.p12'}",
                    "-Djavax.net.ssl.trustStoreType=PKCS12",
                    "-Djavax.net.ssl.trustStorePassword=politeproxy",
                ]
            )
        ),  # fmt: skip
    }
    assert (d / "java-truststore.p12").is_file()
    assert exports == {k: shlex.quote(v) for k, v in expected.items()}, r.stdout  # as a shell reads them
    duck = [x for x in r.stdout.splitlines() if x.startswith("# duckdb:")]
    assert duck == [
        f"# duckdb: SET http_proxy = '127.0.0.1:4567'; SET ca_cert_file = '{bundle}';"
        " SET enable_server_cert_verification = true;"
    ]
    assert (d / "ca.pem").is_file() and (d / "ca-bundle.pem").is_file() and Path(bundle).is_file()
    # Every line is either a comment or an export a POSIX shell accepts.
    sh = need_tool("sh")
    out = subprocess.run(
        [sh, "-c", 'eval "$1" && env', "sh", r.stdout], capture_output=True, text=True, check=True
    ).stdout
    for key, value in expected.items():
        assert f"{key}={value}" in out.splitlines(), key
    # 0.0.0.0 is not an address a client can use: env names loopback instead.
    r = cli(tmp_path, "env", "--data-dir", str(d), "--listen", "0.0.0.0:4567")
    assert "export HTTPS_PROXY=http://127.0.0.1:4567" in r.stdout


def test_defaults_and_environment_variables(tmp_path: Path) -> None:
    # Defaults: 127.0.0.1:3128, data dir under $XDG_DATA_HOME.
    r = cli(tmp_path, "env")
    assert r.returncode == 0, r.stderr
    assert "export HTTPS_PROXY=http://127.0.0.1:3128" in r.stdout
    assert f"export SSL_CERT_FILE={tmp_path / 'xdg' / 'politeproxy' / 'trust-bundle.pem'}" in r.stdout
    # POLITEPROXY_LISTEN and POLITEPROXY_DATA_DIR.
    d = tmp_path / "envdata"
    r = cli(tmp_path, "env", POLITEPROXY_LISTEN="127.0.0.1:5555", POLITEPROXY_DATA_DIR=str(d))
    assert "export HTTPS_PROXY=http://127.0.0.1:5555" in r.stdout
    assert f"export SSL_CERT_FILE={d / 'trust-bundle.pem'}" in r.stdout
    # Flags win over the environment.
    r = cli(tmp_path, "env", "--listen", "127.0.0.1:6666", POLITEPROXY_LISTEN="127.0.0.1:5555")
    assert "export HTTPS_PROXY=http://127.0.0.1:6666" in r.stdout
    # POLITEPROXY_CONFIG: its listen and data_dir apply, and the environment beats the file.
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'listen = "127.0.0.1:7777"\ndata_dir = "{tmp_path / "cfgdata"}"\n')
    r = cli(tmp_path, "env", POLITEPROXY_CONFIG=str(cfg))
    assert "export HTTPS_PROXY=http://127.0.0.1:7777" in r.stdout
    assert f"export SSL_CERT_FILE={tmp_path / 'cfgdata' / 'trust-bundle.pem'}" in r.stdout
    r = cli(tmp_path, "env", POLITEPROXY_CONFIG=str(cfg), POLITEPROXY_LISTEN="127.0.0.1:5555")
    assert "export HTTPS_PROXY=http://127.0.0.1:5555" in r.stdout


def test_ca_command(tmp_path: Path) -> None:
    d = tmp_path / "d"
    r = cli(tmp_path, "ca", "--data-dir", str(d))
    assert r.returncode == 0, r.stderr
    paths = {line.split()[0]: line.split(None, 1)[1] for line in r.stdout.splitlines()}
    assert paths["ca.pem"] == str(d / "ca.pem")
    assert paths["ca-key.pem"] == str(d / "ca-key.pem")
    assert paths["ca-bundle.pem"] == str(d / "ca-bundle.pem")
    assert "commoncrawl.org" in paths["permits"]
    assert all(Path(paths[k]).is_file() for k in ("ca.pem", "ca-key.pem", "ca-bundle.pem"))
    r2 = cli(tmp_path, "ca", POLITEPROXY_DATA_DIR=str(d))
    assert r2.stdout == r.stdout  # the same CA, found through the environment


def test_helper_commands_never_replace_a_running_proxys_ca(tmp_path: Path) -> None:
    """`env`/`ca` run without the proxy's config must not swap the CA the proxy signs with."""
    d = tmp_path / "d"
    cfg = tmp_path / "c.toml"
    cfg.write_text('paced_hosts = ["commoncrawl.org", "*.commoncrawl.org", "other.example"]\n')
    assert cli(tmp_path, "ca", "--config", str(cfg), "--data-dir", str(d)).returncode == 0
    ca = (d / "ca.pem").read_bytes()
    r = cli(tmp_path, "env", "--data-dir", str(d))  # default paced hosts: a narrower set
    assert r.returncode == 0
    assert (d / "ca.pem").read_bytes() == ca
    r = cli(tmp_path, "ca", "--data-dir", str(d), "--config", str(tmp_path / "wider.toml"))
    assert r.returncode == 2  # no such file
    wider = tmp_path / "wider.toml"
    wider.write_text('paced_hosts = ["commoncrawl.org", "*.commoncrawl.org", "other.example", "x.example"]\n')
    r = cli(tmp_path, "ca", "--data-dir", str(d), "--config", str(wider))
    assert r.returncode == 0
    assert (d / "ca.pem").read_bytes() == ca
    assert "x.example" in r.stderr and "politeproxy run" in r.stderr  # it says what will happen


@pytest.mark.slow  # a proxy of its own from the environment: ~2 s
def test_run_configured_only_by_environment(tmp_path: Path, upstream: Upstream, certs: Certs) -> None:
    port = free_port()
    d = tmp_path / "envdata"
    cfg = tmp_path / "env.toml"
    cfg.write_text(FAST + upstream_toml(upstream, certs))
    log = tmp_path / "run.log"
    env = clean_env(
        tmp_path,
        POLITEPROXY_CONFIG=str(cfg),
        POLITEPROXY_DATA_DIR=str(d),
        POLITEPROXY_LISTEN=f"127.0.0.1:{port}",
    )
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [*POLITEPROXY, "run", "-v"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env
        )
    try:

        def up() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return proc.poll() is not None

        wait_for(up, 30, "proxy started from the environment")
        assert proc.poll() is None, log.read_text()
        assert (d / "ca.pem").is_file()
        text = log.read_text()
        assert "store memory" in text, text  # the config file's [schedule] applied
        r = requests.get(
            "https://data.commoncrawl.org/echo?env=1",
            proxies={"https": f"http://127.0.0.1:{port}"},
            verify=str(d / "ca-bundle.pem"),
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["path"] == "/echo?env=1"
        assert (
            requests.get(f"http://127.0.0.1:{port}/ca.pem", timeout=10).content == (d / "ca.pem").read_bytes()
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()


def non_loopback_address() -> str | None:
    """An address of this host that is not loopback (a UDP connect sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else str(addr)


def test_metrics_listen_beyond_loopback_answers_only_allowed_clients(
    proxy_factory: Any, upstream: Upstream, tmp_path: Path
) -> None:
    """--metrics-listen 0.0.0.0 answers loopback and allow_clients, 403 for anyone else, and says so."""
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address to connect from")
    port = free_port()
    p = proxy_factory(
        upstream,
        "",
        top_toml='allow_clients = ["198.51.100.0/24"]\n',
        args=("--metrics-listen", f"0.0.0.0:{port}"),
    )
    wait_for(lambda: "metrics on" in p.log(), 10, "the metrics start line")
    assert f"metrics on 0.0.0.0:{port} answer loopback, 198.51.100.0/24" in p.log()
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    # The same listener reached on this host's own non-loopback address: the client is not loopback.
    r = requests.get(f"http://{addr}:{port}/metrics", timeout=10)
    assert r.status_code == 403, r.text
    assert requests.get(f"http://{addr}:{port}/healthz", timeout=10).status_code == 403
    # Allowed by allow_clients: answered.
    port2 = free_port()
    proxy_factory(
        upstream,
        "",
        top_toml=f'allow_clients = ["{addr}/32"]\n',
        args=("--metrics-listen", f"0.0.0.0:{port2}"),
    )
    assert requests.get(f"http://{addr}:{port2}/metrics", timeout=10).status_code == 200


def test_redis_url_from_the_environment_and_never_logged() -> None:
    """POLITEPROXY_REDIS_URL (the deploy files' password path) sets schedule.redis_url over the file, and
    the change lines of a reload name it without its value; passwords likewise."""
    from politeproxy.config.loading import build, changes, env_overrides

    secret = "redis://:s3cret@redis:6379/0"
    cfg = build(
        {"schedule": {"redis_url": "redis://127.0.0.1:6379/0"}},
        overrides=env_overrides({"POLITEPROXY_REDIS_URL": secret}),
    )
    assert cfg["schedule"]["redis_url"] == secret
    old = build({"auth": {"users": {"alice": "pw1"}}})
    new = build(
        {"auth": {"users": {"alice": "pw2"}}, "pacing": {"max_queue": 10}}, overrides={"redis_url": secret}
    )
    lines = changes(old.raw, new.raw)
    assert "schedule.redis_url changed" in lines and "auth.users.alice changed" in lines
    assert "pacing.max_queue: 1024 -> 10" in lines
    assert not any("s3cret" in ln or "pw1" in ln or "pw2" in ln for ln in lines), lines
    assert new.pacing().max_queue == 10
    with pytest.raises(ConfigError, match=r"pacing\.max_queue"):
        build({"pacing": {"max_queue": 0}})
