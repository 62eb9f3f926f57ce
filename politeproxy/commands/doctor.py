"""``politeproxy doctor``: does this shell's environment send Common Crawl traffic through the proxy?

Checks, in order, each printed as ok or what is wrong and how to fix it:

1. HTTPS_PROXY and https_proxy are set (tools read one case or the other) and agree;
2. politeproxy answers there: its /healthz (200), or its 421 when the admin paths refuse the Host name;
3. each CA bundle named by SSL_CERT_FILE, REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE exists, holds the proxy's
   CA, and makes a paced host's certificate (the proxy's leaf) verify, in a TLS handshake through the proxy;
4. no_proxy and NO_PROXY are both set and neither covers a Common Crawl host;
5. one GET of a paced URL through the proxy comes back 2xx with ``Via: 1.1 politeproxy`` (a 502 the proxy
   made, or any other error, is a failure that shows the answer's first line), sent with ``Cache-Control:
   no-cache`` so the proxy's cache never answers it: the line says the path it took (intercepted, paced,
   answered by the upstream) and what the upstream said.

The fix lines name the command as this shell can run it (``command()``): bare ``politeproxy`` only when
that is the one on PATH, else the installed script's absolute path (``make run`` leaves it in .venv/bin).

Exit 0 when every check passes, 1 otherwise. Standard library only (plus cryptography to read bundles),
so it runs in any shell the proxy's own package is installed in. Every socket has a timeout.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shlex
import shutil
import ssl
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import unquote, urlsplit

from cryptography import x509

from politeproxy.proxy.common.passage import PIPELINE_HEADER, VIA_ENTRY, WAIT_HEADER

DEFAULT_URL = "https://index.commoncrawl.org/collinfo.json"
CC_HOSTS = (
    "index.commoncrawl.org",
    "data.commoncrawl.org",
    "commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
)
BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def command() -> str:
    """How the user runs this politeproxy from any directory: ``politeproxy`` when PATH finds this very
    script, else the script's absolute path, else ``python -m politeproxy`` with this interpreter."""
    script = Path(sys.prefix) / "bin" / "politeproxy"
    found = shutil.which("politeproxy")
    if script.is_file():
        same = found is not None and Path(found).resolve() == script.resolve()
        return "politeproxy" if same else shlex.quote(str(script))
    return "politeproxy" if found else f"{shlex.quote(sys.executable)} -m politeproxy"


COMMAND = command()
FIX_ENV = f'eval "$({COMMAND} env)"'
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 30.0  # a paced request may be held; 30 s is what cdx_toolkit and duckdb wait
MAX_BUNDLE = 16 * 1024 * 1024  # bytes of a CA bundle read (a system bundle is about 200 KiB)
MAX_BODY = 64 * 1024  # bytes of the answer read before closing: the headers are what count
# What the upstream said besides its status: who answered (CloudFront, S3, pywb) and whether a CDN cache did.
UPSTREAM_HEADERS = ("Server", "X-Cache", "Age")


@dataclass(frozen=True)
class Check:
    ok: bool
    what: str
    fix: str = ""


@dataclass(frozen=True)
class ProxyAddr:
    host: str
    port: int
    url: str
    auth: str | None  # the Proxy-Authorization value for a URL with a user name, else None


def parse_proxy(url: str) -> ProxyAddr | None:
    """The proxy a tool would use from an HTTPS_PROXY value (scheme-less means http://), or None when it
    is not a plain-HTTP proxy URL (politeproxy speaks plain HTTP to its clients: no https://, no socks)."""
    try:
        u = urlsplit(url if "://" in url else f"http://{url}")
        port = u.port or 80
    except ValueError:
        return None
    if u.scheme != "http" or not u.hostname:
        return None
    auth = None
    if u.username is not None:
        pair = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
        auth = "Basic " + base64.b64encode(pair).decode()
    return ProxyAddr(u.hostname, port, url, auth)


def check_proxy_vars(env: Mapping[str, str]) -> tuple[list[Check], ProxyAddr | None]:
    upper, lower = env.get("HTTPS_PROXY", ""), env.get("https_proxy", "")
    value = lower or upper  # curl, requests and wget read the lower-case one first
    if not value:
        return [
            Check(False, "neither HTTPS_PROXY nor https_proxy is set: tools go straight out", FIX_ENV)
        ], None
    out: list[Check] = []
    if not upper or not lower:
        missing = "HTTPS_PROXY" if not upper else "https_proxy"
        out.append(Check(False, f"{missing} is not set (some tools read only that case)", FIX_ENV))
    elif upper != lower:
        out.append(Check(False, f"HTTPS_PROXY={upper} but https_proxy={lower}: tools disagree", FIX_ENV))
    proxy = parse_proxy(value)
    if proxy is None:
        why = f"the proxy URL {_masked(value)!r} is not http://HOST:PORT (politeproxy speaks plain HTTP)"
        out.append(Check(False, why, FIX_ENV))
        return out, None
    if not out:
        out.append(Check(True, f"HTTPS_PROXY and https_proxy: {_masked(value)}"))
    return out, proxy


def _masked(url: str) -> str:
    u = urlsplit(url if "://" in url else f"http://{url}")
    if u.password:
        return url.replace(f":{u.password}@", ":***@")
    return url


def _ours(resp: http.client.HTTPResponse) -> bool:
    """Did politeproxy write (or pass on) this answer? Every answer it writes carries its Via entry."""
    return VIA_ENTRY in [v.strip() for v in (resp.getheader("Via") or "").split(",")]


def _first_line(body: bytes) -> str:
    """The first line of an answer's body, for a failure line (client-visible bytes: shown with repr)."""
    line = body.decode("utf-8", "replace").strip().split("\n", 1)[0][:200]
    return line if line.isprintable() else repr(line)


def _admin_get(proxy: ProxyAddr, path: str) -> tuple[int, bool, bytes]:
    """(status, written by politeproxy, body) of a GET of an admin path on the proxy port."""
    conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=CONNECT_TIMEOUT)
    try:
        conn.request("GET", path, headers=_auth(proxy) or {})
        resp = conn.getresponse()
        return resp.status, _ours(resp), resp.read(MAX_BODY)
    finally:
        conn.close()


def check_proxy_answers(proxy: ProxyAddr) -> tuple[Check, bytes | None]:
    """The proxy's /healthz, and its CA from /ca.pem (None when the admin paths are closed to us)."""
    where = f"{proxy.host}:{proxy.port}"
    try:
        status, ours, body = _admin_get(proxy, "/healthz")
    except (OSError, http.client.HTTPException) as e:
        return Check(
            False, f"no proxy answers at {where}: {e}", f"start it: {COMMAND} run (or fix the port)"
        ), None
    if status == 407:
        return Check(
            False, f"the proxy at {where} wants a user name and password", "set them in the URL"
        ), None
    if status == 421 and ours:  # the admin paths refuse the name in HTTPS_PROXY; proxying still works
        why = _first_line(body)
        return Check(True, f"politeproxy answers at {where} (its admin paths refuse this name: {why})"), None
    if status != 200:  # the JSON of a 200 shows it is politeproxy's; its error answers carry its Via
        what = f"{status} {_first_line(body)}" if ours else f"{status}, without `Via: {VIA_ENTRY}`"
        fix = "see the proxy's log" if ours else "HTTPS_PROXY names another server, or fix the port"
        return Check(False, f"{where} answers /healthz with {what}", fix), None
    try:
        health = json.loads(body)
        note = f"store {health.get('store')}, {health.get('queued')} queued"
    except (ValueError, AttributeError):
        return Check(False, f"{where} answers /healthz, but not as politeproxy does", "check the port"), None
    try:
        status, _, pem = _admin_get(proxy, "/ca.pem")
    except (OSError, http.client.HTTPException):
        status, pem = 0, b""
    return Check(True, f"politeproxy answers at {where} ({note})"), pem if status == 200 else None


def _bundle_has(path: str, ca_pem: bytes) -> bool | None:
    """Does the PEM bundle hold the CA certificate? None when either cannot be read."""
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old system roots with odd serials: not ours to judge
            certs = x509.load_pem_x509_certificates(f.read(MAX_BUNDLE))
    except (OSError, ValueError):
        return None
    return any(c == ca for c in certs)


def _handshake(proxy: ProxyAddr, host: str, cafile: str) -> str | None:
    """A TLS handshake with ``host`` through the proxy, verified against ``cafile`` only: None when it
    verifies, else why not. Sends no HTTP request, so it spends no slot."""
    ctx = ssl.create_default_context(cafile=cafile)
    conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=CONNECT_TIMEOUT, context=ctx)
    conn.set_tunnel(host, 443, headers=_auth(proxy))
    try:
        conn.connect()
        return None
    except ssl.SSLCertVerificationError as e:
        return f"{host}'s certificate does not verify with it ({e.verify_message})"
    except (OSError, http.client.HTTPException) as e:
        return f"the TLS handshake with {host} through the proxy failed: {e}"
    finally:
        conn.close()


def check_bundles(
    env: Mapping[str, str], proxy: ProxyAddr | None, ca_pem: bytes | None, host: str
) -> list[Check]:
    out: list[Check] = []
    tried: dict[str, str | None] = {}  # one handshake per distinct file
    holds: dict[str, bool | None] = {}
    for var in BUNDLE_VARS:
        path = env.get(var, "")
        if not path:
            out.append(
                Check(False, f"{var} is not set: tools that read it will not trust the proxy", FIX_ENV)
            )
            continue
        if not os.path.isfile(path):
            out.append(Check(False, f"{var}={path} does not exist", f"{FIX_ENV} (or {COMMAND} ca)"))
            continue
        if ca_pem is not None and path not in holds:
            holds[path] = _bundle_has(path, ca_pem)
        if holds.get(path) is False:
            fix = "the CA was remade or another proxy's bundle is named: " + FIX_ENV
            out.append(Check(False, f"{var}={path} does not hold this proxy's CA", fix))
            continue
        if proxy is not None and path not in tried:
            tried[path] = _handshake(proxy, host, path)
        why = tried.get(path)
        if why is not None:
            out.append(Check(False, f"{var}={path}: {why}", FIX_ENV))
        else:
            out.append(Check(True, f"{var}={path} holds the proxy's CA and {host} verifies with it"))
    return out


def _covers(entry: str, host: str) -> bool:
    """curl's and Python's reading of a no_proxy entry: "*", or a name (a leading "*." or "." ignored, a
    ":port" dropped) equal to the host or a parent domain of it. IP and CIDR entries never match a name."""
    e = entry.strip().lower()
    if e == "*":
        return True
    if e.count(":") == 1:
        e = e.split(":", 1)[0]
    e = e.removeprefix("*").lstrip(".")
    return bool(e) and (host == e or host.endswith("." + e))


def check_no_proxy(env: Mapping[str, str], hosts: tuple[str, ...]) -> list[Check]:
    out: list[Check] = []
    lower, upper = env.get("no_proxy"), env.get("NO_PROXY")
    if lower is None or upper is None:
        missing = "no_proxy" if lower is None else "NO_PROXY"
        out.append(Check(False, f"{missing} is not set (wget reads only no_proxy; others NO_PROXY)", FIX_ENV))
    for var, value in (("no_proxy", lower), ("NO_PROXY", upper)):
        hit = sorted({h for h in hosts for e in (value or "").split(",") if _covers(e, h)})
        if hit:
            fix = f"remove the entries that match {', '.join(hit)} from {var}"
            out.append(Check(False, f"{var} sends {', '.join(hit)} around the proxy (unpaced)", fix))
    if not out:
        out.append(Check(True, "no_proxy and NO_PROXY leave Common Crawl's hosts to the proxy"))
    return out


def check_request(env: Mapping[str, str], proxy: ProxyAddr, url: str) -> Check:
    """One GET through the proxy with the bundle requests would use; the answer must carry our Via."""
    u = urlsplit(url)
    cafile = env.get("REQUESTS_CA_BUNDLE") or env.get("SSL_CERT_FILE") or None
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except OSError as e:
        return Check(False, f"GET {url}: cannot read the CA bundle {cafile}: {e}", FIX_ENV)
    conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=REQUEST_TIMEOUT, context=ctx)
    conn.set_tunnel(u.hostname or "", u.port or 443, headers=_auth(proxy))
    try:
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        # no-cache: the proxy fetches again (and replaces its copy), so the check reaches Common Crawl
        conn.request("GET", target, headers={"User-Agent": "politeproxy-doctor", "Cache-Control": "no-cache"})
        resp = conn.getresponse()
        body = resp.read(MAX_BODY)
    except (OSError, http.client.HTTPException) as e:  # ssl.SSLError is an OSError
        return Check(False, f"GET {url} through the proxy failed: {e}", "see the checks above")
    finally:
        conn.close()
    via = resp.getheader("Via") or ""
    if not _ours(resp):
        why = f"GET {url}: {resp.status}, but no `Via: {VIA_ENTRY}` (Via: {via or 'none'})"
        return Check(False, why, "https_proxy names another proxy, or this one is not politeproxy")
    if not 200 <= resp.status < 300:  # a 502 the proxy made, a 403 from upstream: not a working path
        why = f"GET {url} through the proxy: {resp.status} {resp.reason}: {_first_line(body)}"
        return Check(False, why, "the answer says why; the proxy's log has the details")
    return _path_taken(url, resp)


def _path_taken(url: str, resp: http.client.HTTPResponse) -> Check:
    """Which way the answer came (issue 45): intercepted (our Via on an https answer: a blind tunnel
    carries none), paced (the wait header only the pacer's answers carry; a cache hit has none), and
    answered by the upstream, with what it said."""
    wait, pipeline = (resp.getheader(h) for h in (WAIT_HEADER, PIPELINE_HEADER))
    said = ", ".join(f"{h}: {v}" for h in UPSTREAM_HEADERS if (v := resp.getheader(h)))
    head = f"GET {url} through the proxy: {resp.status}, Via: {resp.getheader('Via')}"
    if not wait:
        why = f"{head}: intercepted, but not paced: the answer did not come from Common Crawl (the cache?)"
        return Check(False, why, "the proxy's access line for it says where it came from")
    paced = f"paced (held {wait} s{f', pipeline {pipeline}' if pipeline else ''})"
    upstream = f"answered by the upstream: {resp.status} {resp.reason}" + (f" ({said})" if said else "")
    return Check(True, f"{head}; intercepted, {paced}, {upstream}")


def _auth(proxy: ProxyAddr) -> dict[str, str] | None:
    return {"Proxy-Authorization": proxy.auth} if proxy.auth else None


def run(env: Mapping[str, str], url: str = DEFAULT_URL, out: TextIO = sys.stdout) -> int:
    host = urlsplit(url).hostname or ""
    checks, proxy = check_proxy_vars(env)
    ca_pem = None
    if proxy is not None:
        answer, ca_pem = check_proxy_answers(proxy)
        checks.append(answer)
        if not answer.ok:
            proxy = None  # nothing to hand-shake with or send through
    checks += check_bundles(env, proxy, ca_pem, host)
    checks += check_no_proxy(env, tuple(dict.fromkeys((*CC_HOSTS, host))))
    if proxy is not None:
        checks.append(check_request(env, proxy, url))
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'}  {c.what}", file=out)
        if c.fix:
            print(f"        fix: {c.fix}", file=out)
    failed = sum(not c.ok for c in checks)
    print("all checks passed" if not failed else f"{failed} of {len(checks)} checks failed", file=out)
    return 0 if not failed else 1


def main(args: argparse.Namespace) -> int:
    u = urlsplit(args.url)
    if u.scheme != "https" or not u.hostname:
        print(f"politeproxy: error: --url {args.url!r}: an https:// URL of a paced host", file=sys.stderr)
        return 2
    return run(os.environ, args.url)
