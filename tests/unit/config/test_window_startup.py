"""The start-up lines say what the request window keeps (issue 24 item 1), and a window turned off
(``egress.limit = 0``) is a warning, whatever the verbosity."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from politeproxy.config.loading import build
from politeproxy.config.startup import announce_pacing, pacing_lines, window_warning


def test_the_default_window_is_announced() -> None:
    s = build({"egress": {"name": "nat-1"}}).pacing()
    line = next(x for x in pacing_lines(s) if "request window" in x)
    assert "4800 requests per 5m" in line and "'nat-1'" in line and "6,000" in line, line
    assert window_warning(s) is None


def test_a_window_turned_off_warns(caplog: pytest.LogCaptureFixture) -> None:
    s = replace(build({}).pacing(), window_limit=0)
    assert not any("request window" in x for x in pacing_lines(s))
    with caplog.at_level(logging.WARNING, logger="politeproxy"):
        announce_pacing(s)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("egress.limit = 0" in m and "6,000" in m for m in warned), warned
