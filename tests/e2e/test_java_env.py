"""The JVM from `politeproxy env` alone (issue 26 item 4): the JDK reads neither HTTPS_PROXY nor
SSL_CERT_FILE, so `env` writes a PKCS12 truststore of its trust bundle (the JDK refuses one without a
password: the password guards nothing secret) and prints a JAVA_TOOL_OPTIONS line. A Java program run with
only that line fetches a paced host through the proxy (`Via: 1.1 politeproxy`). Needs a JDK (java with its
source launcher): skipped without one."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.processes import POLITEPROXY, ROOT
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

pytestmark = pytest.mark.slow  # two JVM starts: about 4 s

GET = """
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Get {
    public static void main(String[] args) throws Exception {
        HttpClient c = HttpClient.newBuilder().proxy(java.net.ProxySelector.getDefault()).build();
        HttpResponse<String> r = c.send(HttpRequest.newBuilder(URI.create(args[0])).build(),
                HttpResponse.BodyHandlers.ofString());
        System.out.println(r.statusCode() + " " + r.headers().firstValue("via").orElse("-"));
    }
}
"""


def test_java_goes_through_the_proxy_with_the_env_line_alone(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    if shutil.which("java") is None:
        pytest.skip("no JDK (java) on this machine")
    p = proxy_factory(upstream, NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n')
    env_argv = [*POLITEPROXY, "env", "--data-dir", str(p.data_dir), "--listen", f"127.0.0.1:{p.port}"]
    out = subprocess.run(env_argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    [line] = [ln for ln in out.splitlines() if ln.startswith("export JAVA_TOOL_OPTIONS=")]
    assert (p.data_dir / "java-truststore.p12").is_file()
    src = tmp_path / "Get.java"
    src.write_text(GET)
    url = "https://data.commoncrawl.org/crawl-data/java-env"
    script = f"{line}\njava {shlex.quote(str(src))} {shlex.quote(url)}\n"
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["200", "1.1", "politeproxy"], (r.stdout, r.stderr[-2000:])
    assert "GET data.commoncrawl.org/crawl-data/java-env paced" in p.log()
