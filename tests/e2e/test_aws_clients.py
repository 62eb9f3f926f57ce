"""The AWS CLI and boto3 through the proxy with the lines of `politeproxy env --pipeline NAME` (issue 26):
HTTPS_PROXY carries `NAME:x@` (botocore sends no Proxy-Authorization for a user name without a password),
AWS_CA_BUNDLE the trust bundle, and an unsigned read of the commoncrawl bucket (virtual-hosted,
commoncrawl.s3.amazonaws.com, impersonated by the fake upstream) counts under NAME in the proxy's access
log. One aws start per test: the CLI takes about a second to start.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.aws import AWS_QUIET, aws_cli
from tests.support.clients import env_output, exported
from tests.support.processes import ROOT, wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import ProxyFactory, arrivals, start_with
from tests.support.upstream_proc import Certs, Upstream

boto3 = pytest.importorskip("boto3")
botocore_config = pytest.importorskip("botocore.config")
from botocore import UNSIGNED  # noqa: E402 - after the skip: boto3 is a test extra

BUCKET_HOST = "commoncrawl.s3.amazonaws.com"


@pytest.fixture(scope="module")
def module_aws(
    module_proxy_factory: ProxyFactory, module_files_upstream: Upstream, module_files_dir: Path, certs: Certs
) -> ProxyProc:
    for name in ("cli.bin", "boto3.bin"):
        (module_files_dir / name).write_bytes(name.encode() * 1000)
    return start_with(module_proxy_factory, module_files_upstream, certs)


@pytest.fixture
def aws_proxy(module_aws: ProxyProc, module_files_upstream: Upstream) -> ProxyProc:
    module_files_upstream.reset()
    return for_this_test(module_aws)


def pipeline_env(p: ProxyProc, name: str) -> dict[str, str]:
    env = exported(env_output(p, "--pipeline", name))
    assert env["HTTPS_PROXY"] == f"http://{name}:x@127.0.0.1:{p.port}", env
    assert env["AWS_CA_BUNDLE"] == str(p.data_dir / "trust-bundle.pem")
    return env


def counted_as(p: ProxyProc, up: Upstream, key: str) -> set[str]:
    """The pipelines the access log names for the bucket's ``key``, once every upstream arrival for it has
    its line (a line is written as its answer ends)."""
    n = len([a for a in arrivals(up) if a["host"] == BUCKET_HOST and a["path"] == f"/{key}"])
    assert n >= 1, arrivals(up)

    def lines() -> list[str]:
        return [x for x in p.log_since().splitlines() if f" {BUCKET_HOST}/{key} paced " in x]

    wait_for(lambda: len(lines()) >= n, 10, f"{n} access-log lines for {key}")
    return {x.rsplit(" pipeline=", 1)[1].split()[0] for x in lines()}


def test_aws_cli_counts_under_the_pipeline(
    aws_proxy: ProxyProc, module_files_upstream: Upstream, tmp_path: Path
) -> None:
    aws = aws_cli()
    env = {**pipeline_env(aws_proxy, "aws-cli"), **AWS_QUIET, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = tmp_path / "cli.bin"
    r = subprocess.run(
        [
            aws,
            "s3api",
            "get-object",
            "--no-sign-request",
            "--bucket",
            "commoncrawl",
            "--key",
            "files/cli.bin",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_bytes() == b"cli.bin" * 1000
    assert counted_as(aws_proxy, module_files_upstream, "files/cli.bin") == {"aws-cli"}


def test_boto3_counts_under_the_pipeline(
    aws_proxy: ProxyProc, module_files_upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process: the env lines as variables (botocore reads HTTPS_PROXY and AWS_CA_BUNDLE)."""
    for k, v in {**pipeline_env(aws_proxy, "boto3"), **AWS_QUIET}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    s3 = boto3.session.Session().client("s3", config=botocore_config.Config(signature_version=UNSIGNED))
    body = s3.get_object(Bucket="commoncrawl", Key="files/boto3.bin")["Body"].read()
    assert body == b"boto3.bin" * 1000
    assert counted_as(aws_proxy, module_files_upstream, "files/boto3.bin") == {"boto3"}
