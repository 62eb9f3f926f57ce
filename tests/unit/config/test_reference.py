"""docs/configuration.md is generated from the table of settings: it fails here while the two disagree."""

from __future__ import annotations

from pathlib import Path

from politeproxy.config.reference import COMMAND, render
from politeproxy.policy.table import SETTINGS

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_reference_matches_the_table() -> None:
    written = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert written == render(), f"docs/configuration.md is out of date with policy/table.py; run: {COMMAND}"


def test_the_reference_has_one_row_per_setting() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) == len(SETTINGS)
    assert any(r.startswith("| `schedule.global_rate` | rate |") and "`--global-rate`" in r for r in rows)
    assert all("*restart*" in r for r in rows if r.startswith("| `listen`"))
