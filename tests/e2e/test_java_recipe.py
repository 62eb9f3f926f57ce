"""The Java recipe of docs/tools.md ("Java and Spark"), run as written (issue 26 item 8): the JVM reads
neither HTTPS_PROXY nor SSL_CERT_FILE, so the page makes a PKCS12 truststore with keytool and sets
JAVA_TOOL_OPTIONS. The shell block is taken from the page itself, with only the data dir and the port
replaced, and the JDK's HttpClient then fetches both paced hosts through the proxy: each answer carries
``Via: 1.1 politeproxy`` and the proxy's access log has the request. The control asks the JVM's proxy
selector, without a connection: with HTTPS_PROXY alone it picks DIRECT. Needs a JDK (java with its source
launcher, keytool): skipped without one.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pytestmark = pytest.mark.slow  # seven JVM starts, four of them keytool (ten until 2026-12-07)

PAGE = ROOT / "docs" / "tools.md"
GET = """
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Get {
    public static void main(String[] args) throws Exception {
        HttpClient c = HttpClient.newBuilder().proxy(java.net.ProxySelector.getDefault()).build();
        for (String url : args) {
            HttpResponse<String> r = c.send(HttpRequest.newBuilder(URI.create(url)).build(),
                    HttpResponse.BodyHandlers.ofString());
            System.out.println(r.statusCode() + " " + r.headers().firstValue("via").orElse("-"));
        }
    }
}
"""


def jdk() -> None:
    for tool in ("java", "keytool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian: openjdk-17-jdk-headless)")
    if not Path("/etc/ssl/certs/java/cacerts").is_file():
        pytest.skip("no /etc/ssl/certs/java/cacerts (Debian's ca-certificates-java)")


def recipe() -> str:
    """The page's shell block under "## Java and Spark"."""
    text = PAGE.read_text()
    section = text[text.index("## Java and Spark") :]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "no shell block in the Java section of docs/tools.md"
    return m.group(1)


@pytest.fixture(scope="module")
def served(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProc, Upstream]]:
    jdk()
    tmp = tmp_path_factory.mktemp("java")
    up = start_upstream(certs, tmp)
    p = start_proxy(tmp, up, certs, NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n')
    yield p, up
    p.stop()
    up.stop()


def java(tmp: Path, urls: list[str], shell_prefix: str) -> subprocess.CompletedProcess[str]:
    """The recipe, then one JVM getting each of ``urls`` in turn (one line each: status and Via)."""
    src = tmp / "Get.java"
    src.write_text(GET)
    script = f"{shell_prefix}\njava {shlex.quote(str(src))} {' '.join(shlex.quote(u) for u in urls)}\n"
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}
    )


def test_the_documented_recipe_sends_java_through_the_proxy(
    served: tuple[ProxyProc, Upstream], tmp_path: Path
) -> None:
    p, _up = served
    block = recipe()
    assert "DATA=~/.local/share/politeproxy" in block and "3128" in block, block
    block = block.replace("DATA=~/.local/share/politeproxy", f"DATA={shlex.quote(str(p.data_dir))}")
    block = block.replace("3128", str(p.port))
    # Both hosts from one run of the block and one JVM (a run and a JVM each until 2026-12-07: ~5 s more
    # of a keytool and a JVM compiling the same source).
    urls = ["https://data.commoncrawl.org/crawl-data/java", "https://index.commoncrawl.org/collinfo.json"]
    r = java(tmp_path, urls, "set -e\n" + block)
    assert r.returncode == 0, r.stderr[-3000:]
    answers = [line.split() for line in r.stdout.splitlines()]
    assert answers == [["200", "1.1", "politeproxy"]] * 2, (r.stdout, p.log()[-3000:])
    log = p.log()
    assert "GET data.commoncrawl.org/crawl-data/java paced" in log, log[-2000:]
    assert "GET index.commoncrawl.org/collinfo.json paced" in log, log[-2000:]


SELECT = """
import java.net.ProxySelector;
import java.net.URI;

public class Select {
    public static void main(String[] args) throws Exception {
        System.out.println(ProxySelector.getDefault().select(URI.create(args[0])));
    }
}
"""


def select(tmp: Path, url: str, shell_prefix: str) -> str:
    """The proxy the JVM's default selector picks for ``url``: no connection is made."""
    src = tmp / "Select.java"
    src.write_text(SELECT)
    script = f"{shell_prefix}\njava {shlex.quote(str(src))} {shlex.quote(url)}\n"
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_the_jvm_ignores_https_proxy_and_obeys_the_recipe(
    served: tuple[ProxyProc, Upstream], tmp_path: Path
) -> None:
    """The control, without a connection: with HTTPS_PROXY alone (what every other tool reads) the JVM
    picks DIRECT, so it would go straight out, unpaced; with the recipe's options it picks the proxy."""
    p, _up = served
    url = "https://data.commoncrawl.org/crawl-data/x"
    assert select(tmp_path, url, f"export HTTPS_PROXY=http://127.0.0.1:{p.port}") == "[DIRECT]"
    block = recipe().replace("DATA=~/.local/share/politeproxy", f"DATA={shlex.quote(str(p.data_dir))}")
    block = block.replace("3128", str(p.port))
    assert select(tmp_path, url, "set -e\n" + block) == f"[HTTP @ 127.0.0.1/<unresolved>:{p.port}]"
