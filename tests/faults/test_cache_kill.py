"""kill -9 in the middle of a cache write, then a restart on the same data dir (issue 14).

The raw upstream sends the first request for /crawl-data/stall... 1 MiB of a 4 MiB body and then
nothing, so the proxy is killed while its temporary file holds a part of the body. Nothing of it may
ever be served: the restarted proxy fetches the object again and serves it whole, then from the cache.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.cache_upstream import S3, RawUpstream, body_for, fetch, raw_fixture, start_cache_proxy
from tests.support.processes import wait_for
from tests.support.upstream_proc import Certs, Upstream, start_upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.faults]

raw = raw_fixture()  # the module-scoped raw upstream fixture (pytest finds it by name)


def part_files(data_dir: Path) -> list[Path]:
    return list((data_dir / "cache" / "tmp").glob("*.part"))


def test_kill_9_mid_write_then_restart_serves_a_correct_body(
    tmp_path: Path, certs: Certs, raw: RawUpstream
) -> None:
    path = "/crawl-data/stall/CC-MAIN-1.warc.gz"
    want = body_for(path, 4 << 20)
    data = tmp_path / "data"
    up = start_upstream(certs, tmp_path)  # one fake upstream for both proxies, stopped at the end
    try:
        _kill_then_restart(tmp_path, certs, raw, up, path, want, data)
    finally:
        up.stop()


def _kill_then_restart(
    tmp_path: Path, certs: Certs, raw: RawUpstream, up: Upstream, path: str, want: bytes, data: Path
) -> None:
    p1 = start_cache_proxy(tmp_path, certs, raw, data_dir=data, up=up)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(_try(p1, path)), daemon=True)
    t.start()
    try:
        wait_for(raw.stalled.is_set, 30, "the upstream to stall mid-body")
        wait_for(lambda: any(f.stat().st_size >= 1 << 20 for f in part_files(data)), 30, "a part written")
        p1.kill()  # SIGKILL: no cleanup of any kind
    finally:
        t.join(30)
    assert got and (not isinstance(got[0], tuple) or got[0][2] != want)  # the first client never got it whole
    objects = [f for f in (data / "cache" / "objects").rglob("*") if f.is_file()]
    assert objects == []  # nothing was renamed into place

    p2 = start_cache_proxy(tmp_path, certs, raw, data_dir=data, up=up)
    try:
        status, _h, body = fetch(p2, S3, path)
        assert status == 200 and body == want, (len(body), body[:8], p2.log()[-2000:])
        assert raw.count(path) == 2
        status, h, body = fetch(p2, S3, path)
        assert status == 200 and body == want and "age" in h
        assert raw.count(path) == 2  # the second answer came from the cache
        assert part_files(data) == []  # the dead writer's part was swept at start
    finally:
        p2.stop()


def _try(p, path: str) -> object:  # type: ignore[no-untyped-def]
    try:
        return fetch(p, S3, path)
    except OSError as e:
        return e
