"""tests/support/reportguard.py: a failure through a frame without a line number is reported as a failure,
not as an INTERNALERROR that takes a pytest-xdist worker down with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

FAILING = """
def _boom():
    raise ValueError("the failure itself")


def _without_lines(code):
    # CPython 3.11 location table: code 15 marks up to 8 code units as having no location.
    n, table = len(code.co_code) // 2, b""
    while n > 0:
        k = min(n, 8)
        table += bytes([0x80 | (15 << 3) | (k - 1)])
        n -= k
    return code.replace(co_linetable=table)


_boom.__code__ = _without_lines(_boom.__code__)


def test_fails_through_a_frame_without_a_line():
    _boom()


def test_passes():
    pass
"""


def run(tmp_path: Path, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(FAILING)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "-n", "1", "test_inner.py"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # two inner pytest runs, each on an xdist worker: ~4-8 s
def test_a_frame_without_a_line_is_a_plain_failure(tmp_path: Path) -> None:
    bare = run(tmp_path)  # the control: pytest 9.2 alone loses the failure (a later one may not)
    summary = bare.stdout.strip().splitlines()[-1]
    lost = "INTERNALERROR" in bare.stdout + bare.stderr and "failed" not in summary
    assert lost or "1 failed, 1 passed" in summary, bare.stdout[-3000:]
    guarded = run(tmp_path, "-p", "tests.support.reportguard")
    out = guarded.stdout
    assert guarded.returncode == 1 and "1 failed, 1 passed" in out, out + guarded.stderr
    assert "INTERNALERROR" not in out + guarded.stderr
    assert "the failure itself" in out and "test_fails_through_a_frame_without_a_line" in out
