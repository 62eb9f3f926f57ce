"""Local failures are the proxy's, not the upstream's (issue 24): each shape of both upstream clients maps
to a 502 whose reason names the cause and the fix, and a local cause the forwarder records nothing for.
And ``--upstream-ca`` / ``POLITEPROXY_UPSTREAM_CA`` set ``[upstream] ca_file`` without a config file."""

from __future__ import annotations

import errno
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from politeproxy.commands.cli import parser
from politeproxy.config.overrides import apply_overrides, env_overrides
from politeproxy.proxy.h1conn import UpstreamFailed
from politeproxy.proxy.upstream import describe_error

URL_ = URL("https://data.commoncrawl.org/x")


class _Key:  # what aiohttp's connector errors read of their connection key
    host, port, ssl = "data.commoncrawl.org", 443, True


def _aiohttp(kind: str) -> BaseException:
    if kind == "tls":
        err = ssl.SSLCertVerificationError(1, "certificate verify failed")
        return aiohttp.ClientConnectorCertificateError(_Key(), err)  # type: ignore[arg-type]
    if kind == "dns":
        return aiohttp.ClientConnectorDNSError(_Key(), OSError(-2, "Name or service not known"))  # type: ignore[arg-type]
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    return aiohttp.ClientConnectorError(_Key(), refused)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["tls", "dns", "refused"])
def test_aiohttps_local_failures_name_the_cause_and_the_fix(kind: str) -> None:
    status, message, local = describe_error(_aiohttp(kind), URL_)
    assert (status, local) == (502, kind)
    assert "not the upstream's answer" in message
    if kind == "tls":
        assert "[upstream] ca_file" in message and "--upstream-ca FILE" in message


@pytest.mark.parametrize("kind", ["tls", "dns", "refused", "request"])
def test_the_lean_clients_local_failures_keep_their_cause(kind: str) -> None:
    status, message, local = describe_error(UpstreamFailed(502, "TLS to x:443 failed", local=kind), URL_)
    assert (status, local) == (502, kind) and "not the upstream's answer" in message


@pytest.mark.parametrize(
    "e",
    [
        UpstreamFailed(502, "upstream x closed without answering"),
        UpstreamFailed(504, "x did not answer in time"),
        aiohttp.ServerDisconnectedError(),
        TimeoutError(),
        aiohttp.ClientSSLError(_Key(), OSError("handshake broke")),  # type: ignore[arg-type]
    ],
)
def test_the_upstreams_failures_stay_the_upstreams(e: BaseException) -> None:
    assert describe_error(e, URL_)[2] == ""


def _merged() -> dict[str, Any]:
    return {"upstream": {"ca_file": ""}}


def test_the_flag_and_the_variable_set_the_upstream_ca(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    merged = _merged()
    apply_overrides(merged, env_overrides({"POLITEPROXY_UPSTREAM_CA": str(pem)}))
    assert merged["upstream"]["ca_file"] == str(pem)
    args = parser().parse_args(["run", "--upstream-ca", str(pem)])
    merged = _merged()
    apply_overrides(merged, {"upstream_ca": args.upstream_ca})
    assert merged["upstream"]["ca_file"] == str(pem)
