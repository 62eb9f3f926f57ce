"""Static checks of the systemd unit in deploy/: its hardening settings and ``systemd-analyze verify``.

External tools: promtool (Debian package ``prometheus``) and systemd-analyze. When one is
missing the test skips locally but fails when the CI environment variable is set.
"""

from __future__ import annotations

from tests.support.deploy import UNIT, require_tool, run

EXPECTED_EXECSTART = (
    "ExecStart=/usr/local/bin/politeproxy run --config /etc/politeproxy/politeproxy.toml "
    "--data-dir /var/lib/politeproxy"
)


def test_unit_hardening_settings():
    lines = UNIT.read_text(encoding="utf-8").splitlines()
    for setting in [
        EXPECTED_EXECSTART,
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "StateDirectory=politeproxy",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ]:
        assert setting in lines, f"{UNIT.name} lacks {setting!r}"
    assert "DynamicUser=yes" in lines or any(
        line.startswith("User=") and line != "User=root" for line in lines
    ), "the service must not run as root"


def test_unit_passes_systemd_analyze_verify(tmp_path):
    systemd_analyze = require_tool("systemd-analyze")
    # The binary is installed by pip on the target host, not here: point ExecStart at a stub
    # executable that exists and keep every other line (and the arguments) as they are.
    stub = tmp_path / "bin" / "politeproxy"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    original = UNIT.read_text(encoding="utf-8").splitlines(keepends=True)
    rewritten = [
        line.replace("ExecStart=/usr/local/bin/politeproxy ", f"ExecStart={stub} ", 1)
        if line.startswith("ExecStart=")
        else line
        for line in original
    ]
    changed = [i for i, (a, b) in enumerate(zip(original, rewritten, strict=True)) if a != b]
    assert len(changed) == 1, "expected exactly one ExecStart= line to rewrite"
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    copy = unit_dir / UNIT.name
    copy.write_text("".join(rewritten), encoding="utf-8")

    result = run([systemd_analyze, "verify", "--man=no", str(copy)])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings (exit status 0): none may name this unit.
    complaints = [line for line in output.splitlines() if UNIT.name in line or str(copy) in line]
    assert not complaints, "\n".join(complaints)
