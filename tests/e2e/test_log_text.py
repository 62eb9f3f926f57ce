"""Issue 42, item 8: text an upstream chose reaches the log without Unicode format and bidi characters.

A ``Server`` header holding U+202E (RIGHT-TO-LEFT OVERRIDE) reached the log verbatim: a terminal or a
log viewer then shows the rest of the line reversed, so a line can read as something it is not. Log lines
drop every character of category Cf from upstream text, as they drop C0 and C1 controls.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.throttling import throttle
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
BIDI = "\u202e\u2066\u200b\ufeff"  # RLO, LRI, zero-width space, BOM: all category Cf


def test_unicode_bidi_controls_from_an_upstream_header_reached_the_log_verbatim(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, NO_ROBOTS + '[pacing]\nblock_hold = "1s"\nmax_wait = "1s"\nretries = 0\n')
    server = f"nginx{BIDI}gnp.exe\x85"
    throttle(upstream, DATA, 1, None, 403, {"Server": server, "X-Note": f"a{BIDI}b"}, "forbidden")
    assert tunnel_get(p.env, DATA, "/size/5?bidi")[0] == 403
    log = p.log()
    assert "nginx" in log and "gnp.exe" in log, log[-3000:]  # the 403's line, with its headers
    bad = sorted({hex(ord(c)) for c in log if c in BIDI or c == "\x85"})
    assert not bad, (bad, log[-3000:])
