"""exec_cmd.py's parts that need no namespace: the env lines read back as variables, and the clear "no" when
this user may not make a network namespace (a kernel without unprivileged user namespaces, seen through a
stand-in ``unshare`` that fails as the real one does there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from politeproxy.commands import exec_cmd


def test_the_env_lines_become_variables() -> None:
    lines = [
        "# politeproxy 1.0: a comment",
        "export HTTPS_PROXY=http://etl:x@127.0.0.1:3128",
        "export SSL_CERT_FILE='/home/me/my data/trust-bundle.pem'",
        "export JAVA_TOOL_OPTIONS='-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=3128'",
        "# duckdb: SET http_proxy = '127.0.0.1:3128';",
    ]
    assert exec_cmd.env_values(lines) == {
        "HTTPS_PROXY": "http://etl:x@127.0.0.1:3128",
        "SSL_CERT_FILE": "/home/me/my data/trust-bundle.pem",
        "JAVA_TOOL_OPTIONS": "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=3128",
    }


def test_a_user_who_may_not_make_a_namespace_is_told_why_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(exec_cmd.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    code = exec_cmd.run("127.0.0.1:9", ["export HTTPS_PROXY=http://127.0.0.1:9"], ["true"])
    err = capsys.readouterr().err
    assert code == exec_cmd.EXIT_SETUP == 125
    assert "cannot isolate COMMAND" in err and "Operation not permitted" in err
    assert "run exec as root, or allow unprivileged user namespaces" in err
    assert "kernel.unprivileged_userns_clone" in err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert exec_cmd.run("127.0.0.1:9", [], []) == 125
    assert "no COMMAND" in capsys.readouterr().err
