"""The status page at ``/`` in a real headless browser (Debian's chromium): the DOM it renders from
``/status`` names the hosts and both pipelines and holds the chart, on the proxy port and on
``--metrics-listen``; no script or style is refused by the page's CSP; and a screenshot is a non-blank PNG in
which the achieved-rate line's colour is drawn.

The proxy has paced requests from two pipelines queued (tests/e2e/test_status.py's set-up).
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chromium import browse as chromium_run
from tests.support.live_status import Live, start_live, stop_live
from tests.support.upstream_proc import Certs

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

ACHIEVED = (0x2B, 0x6C, 0xB0)  # --ach in statuspage.STYLE: the achieved-rate polyline
CHART_BOTTOM = 460  # pixel rows from the top that hold the header, the cards and the chart at 1280 wide


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Live]:
    lv = start_live(tmp_path_factory.mktemp("status-page"), certs)
    yield lv
    stop_live(lv)


def browse(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One bounded headless chromium run (tests/support/chromium.py), the page's scripts given 4 s of
    virtual time to fetch /status and render it."""
    return chromium_run(url, tmp, "--virtual-time-budget=4000", *extra)


def tbody(dom: str, ident: str) -> str:
    m = re.search(rf'<tbody id="{ident}">(.*?)</tbody>', dom, re.S)
    assert m, dom[:2000]
    return m.group(1)


@pytest.mark.parametrize("where", ["proxy port", "metrics-listen"])
def test_the_page_renders_the_status_in_chromium(live: Live, tmp_path: Path, where: str) -> None:
    base = live.proxy.url if where == "proxy port" else live.side
    r = browse(base + "/", tmp_path, "--dump-dom")
    dom = r.stdout
    assert "<tbody" in dom, r.stderr[-3000:]
    hosts = tbody(dom, "hosts")
    assert "data.commoncrawl.org" in hosts and "index.commoncrawl.org" in hosts
    pipes = tbody(dom, "pipelines")
    assert "<td>alpha</td>" in pipes and "<td>beta</td>" in pipes
    assert "(this one)</td>" in tbody(dom, "proxies")  # the heartbeats' list: this proxy at least
    assert '<section id="workers-part" hidden' in dom  # one process: no workers table
    chart = re.search(r'<svg id="chart".*?</svg>', dom, re.S)
    assert chart and '<polyline points="' in chart.group(0) and 'class="ach"' in chart.group(0)
    assert re.search(r'class="ach"[^>]*>|points="[0-9.]+,[0-9.]+ [0-9.]+', chart.group(0))
    conn = re.search(r'<span id="conn"[^>]*>([^<]*)</span>', dom)
    assert conn and conn.group(1).startswith("updated "), conn  # the last fetch of status answered
    assert "Refused to" not in r.stderr and "Content Security Policy" not in r.stderr, r.stderr[-3000:]


def test_a_screenshot_of_the_page_is_not_blank_and_draws_the_chart(live: Live, tmp_path: Path) -> None:
    shot = tmp_path / "status.png"
    r = browse(live.proxy.url + "/", tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.exists(), r.stderr[-3000:]
    width, height, pixels = read_png(shot.read_bytes(), max_rows=CHART_BOTTOM)  # the chart and above
    assert (width, height) == (1280, 900) and len(pixels) == width * CHART_BOTTOM
    background = max(set(pixels[:: max(1, len(pixels) // 5000)]), key=pixels.count)
    drawn = sum(1 for p in pixels if p != background)
    assert drawn > 0.01 * len(pixels), f"{drawn} of {len(pixels)} pixels differ from the background"
    assert sum(1 for p in pixels if near(p, ACHIEVED)) >= 20, "no pixel of the achieved-rate line"


def near(p: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 24 for a, b in zip(p, want, strict=True))


def read_png(data: bytes, max_rows: int) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and the RGB pixels of the first ``max_rows`` rows of an 8-bit RGB or RGBA,
    non-interlaced PNG (what chromium writes); pure Python, so only the rows a check needs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, color, _c, _f, interlace = struct.unpack(">IIBBBBB", ihdr)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(min(height, max_rows)):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        pixels += [(line[i], line[i + 1], line[i + 2]) for i in range(0, stride, bpp)]
        prev = line
    return width, height, pixels
