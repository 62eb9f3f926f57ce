"""A key's flight (proxy/forwarding/flight.py): followers wait for the head without a lock, stream what the
leader wrote as it comes, and end only on a stored copy. A real temporary file; the disk calls run in
threads."""

# ruff: noqa: ASYNC230 - the test's own temporary file, opened in the test: nothing else runs on its loop

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.exchange import Exchange
from politeproxy.proxy.forwarding import flight as fl

T = TypeVar("T")


class Disk:
    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def bg(self, fn: Callable[[], object]) -> None:
        fn()


def ex() -> Exchange:
    return Exchange("127.0.0.1", "GET", "data.commoncrawl.org", "/x", Klass.PACED, "p")


async def test_a_follower_waits_for_the_head_until_head_by_and_no_longer() -> None:
    f = fl.Flight("k", "n", 0.2)
    t0 = asyncio.get_running_loop().time()
    assert await fl._head(f) is False  # no head: the follower goes on its own
    assert 0.15 < asyncio.get_running_loop().time() - t0 < 2.0  # jitter of a loaded box tolerated above
    f = fl.Flight("k", "n", 5.0)
    asyncio.get_running_loop().call_later(0.05, f.end, False)
    assert await fl._head(f) is False  # not storable: at once, not after head_by


async def test_fetching_restarts_the_followers_wait() -> None:
    f = fl.Flight("k", "n", 0.1)
    waiter = asyncio.ensure_future(fl._head(f))
    await asyncio.sleep(0.05)
    f.fetching(5.0)  # the leader goes upstream now
    await asyncio.sleep(0.15)
    assert not waiter.done()  # past the first bound, still waiting
    f.started(200, [("Content-Length", "3")], 3, Path("/nonexistent"))
    assert await waiter is True


async def test_the_pump_streams_as_written_and_ends_only_on_a_stored_copy(tmp_path: Path) -> None:
    part = tmp_path / "x.part"
    part.write_bytes(b"")
    f = fl.Flight("k", "n", 5.0)
    f.started(200, [], 6, part)
    got: list[bytes] = []

    async def write(b: bytes) -> None:
        got.append(b)

    with open(part, "rb", buffering=0) as reader:
        pump = asyncio.ensure_future(fl._pump(Disk(), reader, f, ex(), write))
        with open(part, "ab", buffering=0) as w:
            for piece in (b"ab", b"cd", b"ef"):
                w.write(piece)
                f.wrote(w.tell())
                await asyncio.sleep(0.05)
                assert b"".join(got) == part.read_bytes()  # each piece out before the next comes
        assert not pump.done()  # every byte is out, but the copy is not stored yet
        f.end(True)
        await asyncio.wait_for(pump, 5)
    assert b"".join(got) == b"abcdef"


async def test_the_pump_breaks_when_the_leaders_copy_fails(tmp_path: Path) -> None:
    part = tmp_path / "y.part"
    part.write_bytes(b"abc")
    f = fl.Flight("k", "n", 5.0)
    f.started(200, [], 6, part)
    f.wrote(3)

    async def write(b: bytes) -> None:
        pass

    with open(part, "rb", buffering=0) as reader:
        pump = asyncio.ensure_future(fl._pump(Disk(), reader, f, ex(), write))
        await asyncio.sleep(0.05)
        f.end(False)  # the leader's answer was cut: its followers are cut too
        with pytest.raises(fl._Broken):
            await asyncio.wait_for(pump, 5)
