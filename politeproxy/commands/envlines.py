"""`politeproxy env`: the export lines that point a shell's tools at the proxy, safe to ``eval``.

Every value is shell-quoted (a data dir with a space, a ``$`` or a newline survives ``eval``), and every
comment line shows control characters as escapes (a newline there would end the comment). ``SSL_CERT_FILE``
and friends *replace* a tool's trust store, so they point at a bundle of the system's roots (corporate
chains live there), certifi's roots and the proxy's CA.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import ssl
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.utils import CryptographyDeprecationWarning

from politeproxy import __version__
from politeproxy.config.loading import Config

# Never through the proxy: loopback, and the cloud metadata and credential endpoints (AWS IMDS over
# IPv4 and IPv6, ECS task credentials, GCP's name for it). A proxy in front of them would leak
# instance credentials to it, or fail the SDK's credential lookup.
NO_PROXY = "localhost,127.0.0.1,::1,169.254.169.254,169.254.170.2,fd00:ec2::254,metadata.google.internal"

# Where distributions keep the system's roots (Debian/Ubuntu, RHEL/Fedora, SUSE, Alpine and BSDs).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
MAX_BUNDLE = 16 << 20  # a system bundle is a few hundred KiB
TRUST_BUNDLE = "trust-bundle.pem"
PIPELINE_PASSWORD = "x"  # any non-empty password: the proxy reads only the user name without [auth] users


def system_roots(data_dir: Path) -> Path | None:
    """The system's root bundle, if one is found: OpenSSL's compiled-in default, else the usual places.

    OpenSSL's default is read from its build, not from SSL_CERT_FILE, and a file inside the data dir is
    skipped: a bundle this command wrote must not be folded into the next one."""
    own = data_dir.resolve()
    for name in (ssl.get_default_verify_paths().openssl_cafile, *SYSTEM_BUNDLES):
        with contextlib.suppress(OSError):
            p = Path(name).resolve()
            if p.is_file() and own not in p.parents and p.stat().st_size > 0:
                return p
    return None


def _write_if_changed(path: Path, data: bytes) -> None:
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # public certificates: every user's tools read it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def trust_bundle(data_dir: Path, ca_pem: bytes) -> tuple[Path, Path | None]:
    """Write ``trust-bundle.pem``: the system's roots (where found), certifi's and the proxy's CA.

    Returns the bundle and the system bundle it includes (None when there is none). OSError when the
    data dir cannot be written."""
    parts: list[bytes] = []
    system = system_roots(data_dir)
    if system is not None:
        with open(system, "rb") as f:
            parts.append(b"# system roots: " + str(system).encode() + b"\n" + f.read(MAX_BUNDLE).strip())
    parts.append(b"# certifi\n" + Path(certifi.where()).read_bytes().strip())
    parts.append(b"# politeproxy local CA\n" + ca_pem.strip())
    path = data_dir / TRUST_BUNDLE
    _write_if_changed(path, b"\n\n".join(parts) + b"\n")
    return path, system


JAVA_TRUSTSTORE = "java-truststore.p12"
# The JDK refuses a PKCS12 store without a password (its integrity check); this one guards nothing secret:
# the store holds public certificates only.
JAVA_STORE_PASSWORD = "politeproxy"


def java_truststore(data_dir: Path, bundle: Path) -> Path:
    """Write ``java-truststore.p12`` from the trust bundle: every certificate in it (the system's roots,
    certifi's, the proxy's CA) as a trusted entry the JDK reads (issue 26: the JVM reads neither
    SSL_CERT_FILE nor the system bundle). ValueError when the bundle holds no certificate cryptography
    reads; OSError when the data dir cannot be written."""
    with warnings.catch_warnings():  # a system root with a non-positive serial: read, and warned of by name
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        certs = x509.load_pem_x509_certificates(bundle.read_bytes())
    entries = [pkcs12.PKCS12Certificate(c, f"politeproxy-{i}".encode()) for i, c in enumerate(certs)]
    crypt = serialization.BestAvailableEncryption(JAVA_STORE_PASSWORD.encode())
    path = data_dir / JAVA_TRUSTSTORE
    _write_if_changed(path, pkcs12.serialize_java_truststore(entries, crypt))
    return path


def java_line(cfg: Config, store: Path) -> str:
    """``export JAVA_TOOL_OPTIONS=...``: every JVM started from the shell goes through the proxy (it ignores
    HTTPS_PROXY) and trusts its CA. No pipeline name: the JDK sends proxy credentials only to an
    Authenticator the program installs."""
    host, port = proxy_netloc(cfg).rsplit(":", 1)
    bypass = "|".join(f"[{h}]" if ":" in h else h for h in NO_PROXY.split(","))
    options = [
        f"-Dhttps.proxyHost={host.strip('[]')}", f"-Dhttps.proxyPort={port}",
        f"-Dhttp.proxyHost={host.strip('[]')}", f"-Dhttp.proxyPort={port}",
        f"-Dhttp.nonProxyHosts={bypass}",
        f"-Djavax.net.ssl.trustStore={store}", "-Djavax.net.ssl.trustStoreType=PKCS12",
        f"-Djavax.net.ssl.trustStorePassword={JAVA_STORE_PASSWORD}",
    ]  # fmt: skip
    return f"export JAVA_TOOL_OPTIONS={shlex.quote(' '.join(options))}"


def proxy_netloc(cfg: Config) -> str:
    """HOST:PORT that clients use: a wildcard listen address becomes loopback."""
    host, port = cfg.listen
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PLAIN_URL = re.compile(r"[A-Za-z0-9%.:\[\]_~-]+")  # nothing a shell's double quotes would read


def token_of(cfg: Config, pipeline: str | None) -> tuple[str, str]:
    """(how the pipeline's token is kept, where): ("env", VAR), ("file", PATH), or ("", "") for none."""
    t = cfg.sections.pipelines.get(pipeline or "")
    if t is not None and t.token_env:
        return "env", t.token_env
    if t is not None and t.token_file:
        return "file", t.token_file
    return "", ""


def proxy_value(netloc: str, pipeline: str | None, token_env: str) -> str:
    """The proxy URL as a shell value. The pipeline is the URL's user name, percent-encoded, sent as
    Proxy-Authorization. A password is needed: requests sends no credentials for a user name alone, and
    botocore (the AWS CLI, boto3) none for an empty password; without a token and without [auth] users the
    proxy ignores it (policy/access.py). With a token, the password is a reference to its variable,
    ``"http://NAME:${VAR}@HOST:PORT"``, expanded by the shell that runs the line: never the secret."""
    if not pipeline:
        return shlex.quote(f"http://{netloc}")
    user = quote(pipeline, safe="")
    if token_env and _ENV_NAME.fullmatch(token_env) and _PLAIN_URL.fullmatch(user + netloc):
        return f'"http://{user}:${{{token_env}}}@{netloc}"'
    return shlex.quote(f"http://{user}:{PIPELINE_PASSWORD}@{netloc}")


def export_lines(cfg: Config, ca: Any, bundle: Path, pipeline: str | None) -> list[str]:
    """The lines `politeproxy env` prints; ``pipeline`` is a name already checked by the caller."""
    netloc = proxy_netloc(cfg)
    kind, where = token_of(cfg, pipeline)
    proxy = proxy_value(netloc, pipeline, where if kind == "env" else "")
    values = [
        *(f"{k}={proxy}" for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")),
        # wget and some Go tools read only the lower-case one; others only the upper-case one.
        f"NO_PROXY={shlex.quote(NO_PROXY)}",
        f"no_proxy={shlex.quote(NO_PROXY)}",
        *(
            f"{k}={shlex.quote(str(bundle))}"
            for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE")
        ),
        f"NODE_EXTRA_CA_CERTS={shlex.quote(str(ca.cert_path))}",
    ]
    lines = [f"# politeproxy {__version__}: point your tools at the proxy and trust its CA ({ca.cert_path})"]
    lines += [f"export {v}" for v in values]
    # duckdb's httpfs verifies nothing unless told to, and reads ca_cert_file literally (no ~).
    lines.append(
        f"# duckdb: SET http_proxy = {_sql(netloc)}; SET ca_cert_file = {_sql(str(bundle))}; "
        "SET enable_server_cert_verification = true;"
    )
    if pipeline:
        # duckdb 1.4 sends no proxy credentials without a non-empty password (any, without [auth] users)
        user = _sql(pipeline)
        password = f"<the token in ${where}>" if kind == "env" else _sql(PIPELINE_PASSWORD)
        lines.append(f"# duckdb: SET http_proxy_username = {user}; SET http_proxy_password = {password};")
    if kind:
        lines.append(f"# {token_note(pipeline or '', kind, where)}")
    return [comment_safe(line) if line.startswith("#") else line for line in lines]


def token_note(pipeline: str, kind: str, where: str) -> str:
    """What ``env --pipeline`` says of a pipeline that needs its token (issue 42, item 9)."""
    guest = f"without it, its requests count as the guest pipeline {pipeline}~guest (weight 1)"
    if kind == "env":
        return (
            f"pipeline {pipeline} needs its token: the proxy URL reads it from ${where} when the shell runs "
            f"these lines (set {where} first; its value must be URL-safe: letters, digits, -._~); {guest}"
        )
    return (
        f"pipeline {pipeline} needs its token (token_file {where}): put it in the proxy URL as the "
        f"password, in place of {PIPELINE_PASSWORD!r}; {guest}"
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def comment_safe(line: str) -> str:
    """A comment line with every control character shown as an escape: a newline in a path (the data
    dir's) would end the comment and run the rest as a command under ``eval``. Values need no such care:
    shlex.quote keeps a newline inside its quotes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def env_output(cfg: Config, ca: Any, pipeline: str | None) -> list[str]:
    """Everything `politeproxy env` prints (and `exec` sets): the trust bundle written (or, in a data dir
    this user cannot write, the CA's own bundle), the export lines, the Java line; warnings on stderr."""
    try:
        bundle, system = trust_bundle(cfg.data_dir, ca.pem())
        roots = f"the system's roots ({system}), " if system else "no system roots found, "
    except OSError as e:  # a data dir this user cannot write: the CA's own bundle still works
        print(
            f"politeproxy: warning: cannot write the trust bundle ({e.strerror}); using {ca.bundle_path}",
            file=sys.stderr,
        )
        bundle, roots = ca.bundle_path, "no system roots (not writable), "
    lines = export_lines(cfg, ca, bundle, pipeline)
    lines.append(f"# {bundle.name}: {roots}certifi's roots and the proxy's CA")
    try:  # the JVM reads neither HTTPS_PROXY nor SSL_CERT_FILE (docs/tools.md, Java and Spark)
        lines += [
            "# Java, Spark: the proxy and a truststore of the bundle",
            java_line(cfg, java_truststore(cfg.data_dir, bundle)),
        ]
    except (OSError, ValueError) as e:
        print(
            f"politeproxy: warning: no Java truststore ({e}); see docs/tools.md for keytool", file=sys.stderr
        )
    return lines
