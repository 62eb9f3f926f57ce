"""`politeproxy env --pipeline NAME` (issue 26 item 5): the proxy URL carries a non-empty password, since
botocore (the AWS CLI, boto3) sends no Proxy-Authorization for a user name without one; the proxy, with
no [auth] users, reads only the user name, whatever the password."""

from __future__ import annotations

import subprocess
from urllib.parse import unquote, urlsplit

import pytest
import requests

from tests.support.pipelines import D, Factory, config, metric_lines
from tests.support.processes import POLITEPROXY, ROOT, need_tool
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream


@pytest.fixture(scope="module")
def named_proxy(module_proxy_factory: Factory, module_upstream: Upstream) -> ProxyProc:
    return module_proxy_factory(module_upstream, config(0.0))


def _printed_proxy_url(p: ProxyProc, name: str) -> str:
    out = subprocess.run(
        [*POLITEPROXY, "env", "--data-dir", str(p.data_dir), "--listen", f"127.0.0.1:{p.port}"]
        + ["--pipeline", name],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    ).stdout
    line = next(v for v in out.splitlines() if v.startswith("export HTTPS_PROXY="))
    return line.removeprefix("export HTTPS_PROXY=").strip("'")


def botocore_sends_credentials(proxy_url: str) -> bool:
    """botocore's rule (httpsession.ProxyConfiguration): Proxy-Authorization only when the proxy URL has
    both a user name and a password."""
    u = urlsplit(proxy_url)
    return bool(u.username) and bool(u.password)


def test_the_printed_url_has_a_password_botocore_keeps(named_proxy: ProxyProc) -> None:
    url = _printed_proxy_url(named_proxy, "aws-cli")
    assert unquote(urlsplit(url).username or "") == "aws-cli"
    assert botocore_sends_credentials(url), url


@pytest.mark.parametrize("password", ["x", "anything-else"])
def test_the_password_is_ignored_without_auth_users(named_proxy: ProxyProc, password: str) -> None:
    """requests and curl through the printed URL (and with another password): counted under the name."""
    p = named_proxy
    name = f"pw-{password}"
    url = _printed_proxy_url(p, name).replace(":x@", f":{password}@")
    r = requests.get(f"http://{D}/p/{name}/requests", proxies={"http": url}, timeout=30)
    assert r.status_code == 200, r.text
    curl = subprocess.run(
        [need_tool("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-x", url]
        + [f"http://{D}/p/{name}/curl"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert curl.stdout == "200", curl.stderr
    grants = [line for line in metric_lines(p, "politeproxy_grants_total") if f'pipeline="{name}"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in grants) == 2, grants
