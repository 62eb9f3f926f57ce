"""The docs' picture of the status page (README.md, docs/index.md): docs/img/status.png is a screenshot
of the page of a live proxy, taken by headless chromium, with two pipelines queued
(tests/support/live_status.py).

The test always takes the screenshot and checks that it is a PNG of the window's size, small enough to commit;
with ``POLITEPROXY_DOCS_SCREENSHOT=1`` (``make docs-screenshot``) it also writes it to docs/img/status.png.
The committed picture must be a PNG of that size too, so the README never shows a placeholder.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chromium import browse
from tests.support.live_status import Live, start_live, stop_live
from tests.support.processes import ROOT
from tests.support.upstream_proc import Certs

pytestmark = pytest.mark.slow  # a proxy with queued pipelines, a few seconds of history, one chromium run

DOCS_IMG = ROOT / "docs" / "img" / "status.png"
WIDTH, HEIGHT = 1100, 1150  # the header, the cards, the chart, the hosts, windows and pipelines
MAX_BYTES = 200 * 1024  # a picture in the repository, read on every clone


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Live]:
    lv = start_live(tmp_path_factory.mktemp("status-shot"), certs)
    yield lv
    stop_live(lv)


def test_the_screenshot_of_the_status_page(live: Live, tmp_path: Path) -> None:
    # A few grants first (one per second), so the chart's line and the pipelines' shares are not empty.
    deadline = time.monotonic() + 20
    while live.status()["overall"]["grants_since_start"] < 8 and time.monotonic() < deadline:
        time.sleep(0.5)
    shot = tmp_path / "status.png"
    r = browse(
        live.proxy.url + "/",
        tmp_path,
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{HEIGHT}",
        "--virtual-time-budget=4000",
    )
    assert shot.exists(), r.stderr[-3000:]
    data = shot.read_bytes()
    assert png_size(data) == (WIDTH, HEIGHT)
    assert len(data) <= MAX_BYTES, f"{len(data)} bytes"
    if os.environ.get("POLITEPROXY_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_IMG)


def test_the_committed_picture_is_a_real_screenshot() -> None:
    data = DOCS_IMG.read_bytes()
    assert png_size(data) == (WIDTH, HEIGHT), "run make docs-screenshot"
    assert len(data) <= MAX_BYTES
