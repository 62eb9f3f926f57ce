"""door/deadline.py: one bound per connection, moved later without a new timer, ended on time."""

from __future__ import annotations

import asyncio

from politeproxy.proxy.door.deadline import Deadline


async def test_a_bound_moved_later_keeps_its_timer_and_ends_at_the_new_time() -> None:
    loop = asyncio.get_running_loop()
    ended: list[float] = []
    d = Deadline(lambda: ended.append(loop.time()))
    start = loop.time()
    d.set(0.05)
    first = d.timer
    d.set(0.15)  # later: the timer already set is kept
    assert d.timer is first
    await asyncio.sleep(0.3)
    assert len(ended) == 1
    assert ended[0] - start >= 0.15 - 0.003  # never before the moved time (loop rounding tolerated)


async def test_a_bound_moved_earlier_gets_a_new_timer() -> None:
    loop = asyncio.get_running_loop()
    ended: list[float] = []
    d = Deadline(lambda: ended.append(loop.time()))
    start = loop.time()
    d.set(5.0)
    d.set(0.05)
    await asyncio.sleep(0.2)
    assert len(ended) == 1 and ended[0] - start < 1.0


async def test_lifted_and_stopped_bounds_end_nothing() -> None:
    ended: list[str] = []
    d = Deadline(lambda: ended.append("default"))
    d.set(0.03)
    d.set(0)  # lifted: the timer may still fire, and does nothing
    await asyncio.sleep(0.1)
    d.set(0.03, lambda: ended.append("other"))
    d.stop()
    assert d.timer is None
    await asyncio.sleep(0.1)
    assert ended == []


async def test_the_callback_given_runs_once_then_the_default_again() -> None:
    ended: list[str] = []
    d = Deadline(lambda: ended.append("default"))
    d.set(0.02, lambda: ended.append("linger"))
    await asyncio.sleep(0.1)
    d.set(0.02)
    await asyncio.sleep(0.1)
    assert ended == ["linger", "default"]
