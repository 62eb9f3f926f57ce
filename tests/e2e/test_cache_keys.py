"""What the cache key holds (issue 25, items 1 and 2): the scheme, the port and the exact target.

Three raw upstreams that name themselves in every body (tests/support/misbehave.py): the TLS one for
data.commoncrawl.org:443 and index.commoncrawl.org:443, a cleartext one for port 80 (what a tampered
cleartext leg could say), and a TLS one for port 8443. Clients: curl (which sends percent-escapes as
given) and requests (plain http:// through the proxy).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from tests.support.cache_upstream import CACHE_TOML
from tests.support.misbehave import Misbehaving
from tests.support.processes import need_tool
from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.upstream_proc import Certs

D = "data.commoncrawl.org"
I = "index.commoncrawl.org"  # noqa: E741 - the index server's name


@dataclass
class Env:
    p: ProxyProc
    tls: Misbehaving
    clear: Misbehaving
    other: Misbehaving


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cache-keys")
    tls, clear, other = (
        Misbehaving("tls", certs.server_pem),
        Misbehaving("clear"),
        Misbehaving("other", certs.server_pem),
    )
    resolve = "\n".join(
        [f'"{h}:443" = "127.0.0.1:{tls.port}"' for h in (D, I)]
        + [f'"{h}:80" = "127.0.0.1:{clear.port}"' for h in (D, I)]
        + [f'"{D}:8443" = "127.0.0.1:{other.port}"']
    )
    text = CACHE_TOML + f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n{resolve}\n'
    p = start_proxy(tmp, None, None, text, top_toml="tunnel_ports = [443, 8443]\n")
    yield Env(p, tls, clear, other)
    p.stop()
    for s in (tls, clear, other):
        s.close()


def curl(p: ProxyProc, url: str, *args: str) -> str:
    r = subprocess.run(
        [need_tool("curl"), "-sS", "--path-as-is", "--max-time", "30", *args, url],
        env=p.env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def plain(p: ProxyProc, url: str, headers: dict[str, str] | None = None) -> str:
    r = requests.get(url, proxies={"http": p.url}, headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def test_a_cleartext_answer_never_reaches_an_https_client(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/clear.warc.gz"
    assert plain(env.p, f"http://{D}{path}") == f"clear|GET|{path}"
    assert plain(env.p, f"http://{D}{path}") == f"clear|GET|{path}"
    assert env.clear.count(path) == 2  # cleartext is never served from the cache either
    for _ in range(2):
        assert curl(env.p, f"https://{D}{path}") == f"tls|GET|{path}"
    assert env.tls.count(path) == 1  # the second https fetch was a hit of the TLS answer
    # A cleartext no-cache refetch replaces nothing: the TLS entry still answers, without asking anyone.
    assert plain(env.p, f"http://{D}{path}", {"Cache-Control": "no-cache"}) == f"clear|GET|{path}"
    assert curl(env.p, f"https://{D}{path}") == f"tls|GET|{path}"
    assert env.tls.count(path) == 1


def test_collinfo_cannot_be_poisoned_over_cleartext(env: Env) -> None:
    assert (
        plain(env.p, f"http://{I}/collinfo.json", {"Cache-Control": "no-cache"}) == "clear|GET|/collinfo.json"
    )
    assert curl(env.p, f"https://{I}/collinfo.json") == "tls|GET|/collinfo.json"
    assert curl(env.p, f"https://{I}/collinfo.json") == "tls|GET|/collinfo.json"
    assert env.tls.count("/collinfo.json") == 1


def test_an_answer_from_another_port_is_served_only_to_that_port(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/port.warc.gz"
    assert curl(env.p, f"https://{D}:8443{path}") == f"other|GET|{path}"
    assert curl(env.p, f"https://{D}{path}") == f"tls|GET|{path}"
    assert curl(env.p, f"https://{D}:8443{path}") == f"other|GET|{path}"
    assert curl(env.p, f"https://{D}{path}") == f"tls|GET|{path}"
    assert (env.other.count(path), env.tls.count(path)) == (1, 1)  # each port's entry is its own


@pytest.mark.parametrize(
    "a,b",
    [("%FF", "%FE"), ("x%C0", "x%EF%BF%BD"), ("%41", "A"), ("a%2Fb", "a/b")],
)
def test_two_spellings_are_two_objects(env: Env, a: str, b: str) -> None:
    """The key is the target's exact bytes: each spelling gets its own upstream answer, and each later
    request is a hit of its own spelling."""
    base = f"/crawl-data/CC-MAIN-2024-10/esc-{a.replace('%', 'p').replace('/', 's')}/"
    for _ in range(2):
        for x in (a, b):
            assert curl(env.p, f"https://{D}{base}{x}") == f"tls|GET|{base}{x}"
    assert (env.tls.count(base + a), env.tls.count(base + b)) == (1, 1)
