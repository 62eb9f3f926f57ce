"""Names with an owner, end to end (issue 27 item 3): ``[pipelines.urls] token_env`` makes the name
binding. A client that names ``urls`` with the secret counts as urls; one with another password counts as
the guest pipeline ``urls~guest`` (its own share at weight 1, its own line, so it cannot fill the real
pipeline's ``max_queued``), and the first such request per minute is logged. A proxy whose token variable
is not set refuses to start, naming the variable."""

from __future__ import annotations

import base64
import http.client
import os
import re
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.pipelines import D, Factory, config, metric_lines
from tests.support.processes import POLITEPROXY, ROOT
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream

SECRET = "correct-horse"
PIPES = '[pipelines.urls]\ntoken_env = "PP_TOKEN_URLS"\nmax_queued = 2\n'


def get(p: ProxyProc, user: str, password: str, tag: str) -> int:
    proxy = f"http://{user}:{password}@127.0.0.1:{p.port}"
    return requests.get(f"http://{D}/p/{tag}", proxies={"http": proxy}, timeout=30).status_code


def labels(p: ProxyProc) -> set[str]:
    lines = metric_lines(p, "politeproxy_grants_total")
    return {
        m.group(1)
        for line in lines
        if (m := re.search(r'pipeline="([^"]*)"', line)) and line.split()[-1] != "0.0"
    }


@pytest.mark.slow  # six guests queued behind a 0.3 s gap: ~3 s
def test_a_name_claimed_without_its_token_gets_a_guest_share(
    proxy_factory: Factory, upstream: Upstream
) -> None:
    p = proxy_factory(upstream, config(0.3, extra=PIPES), env={"PP_TOKEN_URLS": SECRET})
    assert get(p, "urls", SECRET, "owner") == 200
    # Six guests at once: the real pipeline's max_queued (2) would refuse them if they counted as urls.
    with ThreadPoolExecutor(6) as ex:
        codes = list(ex.map(lambda i: get(p, "urls", "guess", f"guest{i}"), range(6)))
    assert codes == [200] * 6, codes
    assert {"urls", "urls~guest"} <= labels(p), labels(p)
    log = p.log()
    assert log.count("without its token") == 1 and "urls~guest" in log, log[-2000:]
    assert SECRET not in log and "guess" not in log  # neither password is ever logged


def test_a_token_variable_that_is_not_set_stops_the_start(tmp_path: Path) -> None:
    cfg = tmp_path / "pp-token.toml"
    cfg.write_text(PIPES)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    data = tmp_path / "data"
    argv = [*POLITEPROXY, "run", "--config", str(cfg), "--data-dir", str(data), "--listen", "127.0.0.1:0"]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "PP_TOKEN_URLS is not set" in r.stderr, r.stderr


def raw_get(p: ProxyProc, user: str, password: str, tag: str) -> tuple[int, str]:
    """A plain GET whose Proxy-Authorization carries ``user`` as UTF-8, exactly as given."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
    try:
        c.request("GET", f"http://{D}/p/{tag}", headers={"Proxy-Authorization": f"Basic {auth}"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def test_tokens_were_checked_on_the_raw_name_then_the_name_was_cleaned(
    proxy_factory: Factory, upstream: Upstream
) -> None:
    """Issue 42, item 3: look-alikes of a token pipeline's name (8 of 15 counted as it, without its secret)
    are refused with 407 naming the rule, over plain http:// and CONNECT alike; nothing reaches upstream."""
    pipes = '[pipelines.url_fetch]\ntoken_env = "PP_TOKEN_URLS"\nweight = 4\n'
    p = proxy_factory(upstream, config(0.0, extra=pipes), env={"PP_TOKEN_URLS": SECRET})
    for i, name in enumerate(["url fetch", 'url"fetch', "urléfetch", "url\x01fetch", "url\\fetch"]):
        status, body = raw_get(p, name, "guess", f"look{i}")
        assert status == 407 and "url_fetch" in body and "token" in body, (name, status, body)
    s = socket.create_connection(("127.0.0.1", p.port), timeout=30)
    auth = base64.b64encode(b"url fetch:guess").decode()
    s.sendall(
        f"CONNECT {D}:443 HTTP/1.1\r\nHost: {D}:443\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 407")
    s.close()
    assert [a for a in upstream.log() if a["path"].startswith("/p/look")] == []
    assert raw_get(p, "url_fetch", SECRET, "owner")[0] == 200  # the name itself, with its token
    assert raw_get(p, "url_fetch", "guess", "guest")[0] == 200  # without it: the guest share, as before
    assert SECRET not in p.log() and "guess" not in p.log()


def test_env_pipeline_made_a_token_pipeline_a_guest_without_saying_so(
    proxy_factory: Factory, upstream: Upstream
) -> None:
    """Issue 42, item 9: ``env --pipeline urls`` for a pipeline with a token says so, and its proxy URL
    refers to the token's variable (``http://urls:${PP_TOKEN_URLS}@...``), expanded by the shell that
    evaluates the lines: the secret is never printed, and the requests count as urls, not urls~guest."""
    p = proxy_factory(upstream, config(0.0, extra=PIPES), env={"PP_TOKEN_URLS": SECRET})
    argv = [*POLITEPROXY, "env", "--config", str(p.config_path), "--data-dir", str(p.data_dir)]
    argv += ["--listen", f"127.0.0.1:{p.port}", "--pipeline", "urls"]
    shell_env = {**os.environ, "PP_TOKEN_URLS": SECRET}
    r = subprocess.run(argv, cwd=ROOT, env=shell_env, capture_output=True, text=True, timeout=60, check=True)
    assert SECRET not in r.stdout and SECRET not in r.stderr
    assert "needs its token" in r.stderr and "PP_TOKEN_URLS" in r.stderr, r.stderr
    assert 'export HTTPS_PROXY="http://urls:${PP_TOKEN_URLS}@127.0.0.1:' in r.stdout, r.stdout
    script = f'eval "$1"; curl -sS -o /dev/null -w "%{{http_code}}" -x "$HTTP_PROXY" http://{D}/p/urls/env'
    curl = subprocess.run(
        ["bash", "-c", script, "bash", r.stdout], env=shell_env, capture_output=True, text=True, timeout=60
    )
    assert curl.stdout == "200", curl.stderr
    assert "urls" in labels(p) and "urls~guest" not in labels(p), labels(p)
    assert "without its token" not in p.log()
